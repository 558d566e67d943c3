package agentproto

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// An announcement tells a pod's agent (init with --net-channel) which channel address to dial from now on: the
// replica that took the pod's key over from another writes one into the pod's token directory (through the API
// server's exec, `sandkeep-agent announce`), so the agent follows its key's owner at once instead of dialling
// the address it was made with, where nobody answers any more. It is one line:
//
//	"SKAN" SP version SP seq SP addr SP mac LF
//
// seq is a decimal uint64 that must exceed the last one the agent followed (an announcement read again, or an
// old one written back, changes nothing); addr is an IP literal and a port, as --net-channel; mac is the hex
// HMAC-SHA256, keyed by the pod's channel token, of the pod's name, version, seq and addr. Commands in the pod
// can write the file (they run as the agent's uid) but do not know the token, so they cannot forge one and
// cannot send the agent, with its token in its hello, anywhere but where a replica that knows the token said.
const (
	announceMagic   = "SKAN"
	AnnounceVersion = 1
	// MaxAnnouncement bounds an announcement's length: what the agent reads of the file, at most.
	MaxAnnouncement = 256
	announceMACHex  = 2 * sha256.Size
)

// ErrAnnouncement marks an announcement that is not one: malformed, or its MAC is not the pod's.
var ErrAnnouncement = errors.New("bad channel announcement")

// Announcement is what an announcement says: dial Addr, as of Seq.
type Announcement struct {
	Seq  uint64
	Addr string
}

// FormatAnnouncement encodes a for pod, authenticated with the pod's channel token.
func FormatAnnouncement(a Announcement, pod string, token []byte) ([]byte, error) {
	if err := CheckChannelAddr(a.Addr); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAnnouncement, err)
	}
	if pod == "" || len(token) < MinHelloToken {
		return nil, fmt.Errorf("%w: no pod name or token", ErrAnnouncement)
	}
	mac := announceMAC(a, pod, token)
	b := fmt.Appendf(nil, "%s %d %d %s %s\n", announceMagic, AnnounceVersion, a.Seq, a.Addr, hex.EncodeToString(mac))
	if len(b) > MaxAnnouncement {
		return nil, fmt.Errorf("%w: %d bytes", ErrAnnouncement, len(b))
	}
	return b, nil
}

// SplitAnnouncement checks b's form (not its MAC, which needs the token) and returns what it says.
func SplitAnnouncement(b []byte) (Announcement, []byte, error) {
	if len(b) > MaxAnnouncement {
		return Announcement{}, nil, fmt.Errorf("%w: %d bytes", ErrAnnouncement, len(b))
	}
	fields := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte(" "))
	if len(fields) != 5 || string(fields[0]) != announceMagic {
		return Announcement{}, nil, fmt.Errorf("%w: not an announcement line", ErrAnnouncement)
	}
	if string(fields[1]) != strconv.Itoa(AnnounceVersion) {
		return Announcement{}, nil, fmt.Errorf("%w: version %q, want %d", ErrAnnouncement, fields[1], AnnounceVersion)
	}
	seq, err := strconv.ParseUint(string(fields[2]), 10, 64)
	if err != nil || string(fields[2]) != strconv.FormatUint(seq, 10) { // one spelling per number
		return Announcement{}, nil, fmt.Errorf("%w: seq %q", ErrAnnouncement, fields[2])
	}
	a := Announcement{Seq: seq, Addr: string(fields[3])}
	if err := CheckChannelAddr(a.Addr); err != nil {
		return Announcement{}, nil, fmt.Errorf("%w: %v", ErrAnnouncement, err)
	}
	if len(fields[4]) != announceMACHex {
		return Announcement{}, nil, fmt.Errorf("%w: a MAC of %d hex digits", ErrAnnouncement, len(fields[4]))
	}
	mac := make([]byte, sha256.Size)
	if _, err := hex.Decode(mac, fields[4]); err != nil {
		return Announcement{}, nil, fmt.Errorf("%w: MAC: %v", ErrAnnouncement, err)
	}
	return a, mac, nil
}

// ParseAnnouncement reads b and believes it only when its MAC is pod's under token.
func ParseAnnouncement(b []byte, pod string, token []byte) (Announcement, error) {
	a, mac, err := SplitAnnouncement(b)
	if err != nil {
		return Announcement{}, err
	}
	if !hmac.Equal(mac, announceMAC(a, pod, token)) {
		return Announcement{}, fmt.Errorf("%w: not this pod's (MAC)", ErrAnnouncement)
	}
	return a, nil
}

// announceMAC is the MAC of a for pod: every field length-prefixed, so no two announcements share an input.
func announceMAC(a Announcement, pod string, token []byte) []byte {
	h := hmac.New(sha256.New, token)
	for _, f := range []string{announceMagic, strconv.Itoa(AnnounceVersion), pod, strconv.FormatUint(a.Seq, 10), a.Addr} {
		h.Write(strconv.AppendInt(nil, int64(len(f)), 10))
		h.Write([]byte{':'})
		h.Write([]byte(f))
	}
	return h.Sum(nil)
}

// CheckChannelAddr checks a network channel's address: an IP literal and a port in 1..65535 (the pods' channel
// NetworkPolicy allows the server by address, and a pod needs no DNS to find it).
func CheckChannelAddr(v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("channel address %q: %v", v, err)
	}
	if net.ParseIP(host) == nil {
		return fmt.Errorf("channel address %q: the host must be an IP address", v)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || port != strconv.Itoa(n) {
		return fmt.Errorf("channel address %q: bad port", v)
	}
	return nil
}
