package agentproto

import (
	"bytes"
	"errors"
	"testing"
)

var announceToken = bytes.Repeat([]byte("k"), 64)

// TestAnnouncementRoundTrip: what a replica formats for a pod, that pod's agent believes, and only that pod's.
func TestAnnouncementRoundTrip(t *testing.T) {
	for _, addr := range []string{"10.213.0.1:7070", "[fd00::1]:7070"} {
		a := Announcement{Seq: 1764806400000000000, Addr: addr}
		b, err := FormatAnnouncement(a, "sandkeep-u-0123", announceToken)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseAnnouncement(b, "sandkeep-u-0123", announceToken)
		if err != nil || got != a {
			t.Fatalf("ParseAnnouncement(%q) = %+v, %v; want %+v", b, got, err, a)
		}
		if _, _, err := SplitAnnouncement(b); err != nil {
			t.Fatalf("SplitAnnouncement(%q) = %v", b, err)
		}
	}
}

// TestAnnouncementRefusals: a command in the pod can write the file but knows no token: whatever it changes in a
// genuine announcement (the address, the seq), or one for another pod or under another token, is refused.
func TestAnnouncementRefusals(t *testing.T) {
	good, err := FormatAnnouncement(Announcement{Seq: 7, Addr: "10.0.0.2:7070"}, "pod-a", announceToken)
	if err != nil {
		t.Fatal(err)
	}
	mac := good[bytes.LastIndexByte(good[:len(good)-1], ' ')+1:]
	for name, tc := range map[string]struct {
		b     []byte
		pod   string
		token []byte
	}{
		"other pod":     {good, "pod-b", announceToken},
		"other token":   {good, "pod-a", bytes.Repeat([]byte("x"), 64)},
		"address moved": {append([]byte("SKAN 1 7 10.0.0.66:7070 "), mac...), "pod-a", announceToken},
		"seq raised":    {append([]byte("SKAN 1 8 10.0.0.2:7070 "), mac...), "pod-a", announceToken},
		"seq spelled":   {append([]byte("SKAN 1 07 10.0.0.2:7070 "), mac...), "pod-a", announceToken},
		"a host name":   {append([]byte("SKAN 1 7 evil.example:7070 "), mac...), "pod-a", announceToken},
		"version":       {append([]byte("SKAN 2 7 10.0.0.2:7070 "), mac...), "pod-a", announceToken},
		"magic":         {append([]byte("SKCH 1 7 10.0.0.2:7070 "), mac...), "pod-a", announceToken},
		"short mac":     {[]byte("SKAN 1 7 10.0.0.2:7070 00\n"), "pod-a", announceToken},
		"extra field":   {append([]byte("SKAN 1 7 10.0.0.2:7070 x "), mac...), "pod-a", announceToken},
		"empty":         {nil, "pod-a", announceToken},
		"too long":      {bytes.Repeat([]byte("S"), MaxAnnouncement+1), "pod-a", announceToken},
	} {
		if a, err := ParseAnnouncement(tc.b, tc.pod, tc.token); !errors.Is(err, ErrAnnouncement) {
			t.Errorf("%s: ParseAnnouncement = %+v, %v; want ErrAnnouncement", name, a, err)
		}
	}
	for name, a := range map[string]Announcement{
		"host name": {Seq: 1, Addr: "sandkeep:7070"},
		"no port":   {Seq: 1, Addr: "10.0.0.2"},
		"port 0":    {Seq: 1, Addr: "10.0.0.2:0"},
	} {
		if _, err := FormatAnnouncement(a, "pod-a", announceToken); !errors.Is(err, ErrAnnouncement) {
			t.Errorf("%s: FormatAnnouncement = %v; want ErrAnnouncement", name, err)
		}
	}
}

// FuzzParseAnnouncement: any input is refused with ErrAnnouncement, or is an announcement that formats back to
// exactly the bytes read (one spelling each); never a panic. The form alone (SplitAnnouncement) is checked too.
func FuzzParseAnnouncement(f *testing.F) {
	good, _ := FormatAnnouncement(Announcement{Seq: 42, Addr: "10.213.0.1:7070"}, "pod", announceToken)
	f.Add(good)
	f.Add([]byte("SKAN 1 18446744073709551615 [::1]:1 " + string(bytes.Repeat([]byte("0"), 64)) + "\n"))
	f.Add([]byte("SKAN 1 1 1.2.3.4:99999 00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if a, _, err := SplitAnnouncement(b); err != nil {
			if !errors.Is(err, ErrAnnouncement) {
				t.Fatalf("SplitAnnouncement error %v is not ErrAnnouncement", err)
			}
		} else if CheckChannelAddr(a.Addr) != nil {
			t.Fatalf("SplitAnnouncement accepted address %q", a.Addr)
		}
		a, err := ParseAnnouncement(b, "pod", announceToken)
		if err != nil {
			if !errors.Is(err, ErrAnnouncement) {
				t.Fatalf("ParseAnnouncement error %v is not ErrAnnouncement", err)
			}
			return
		}
		again, err := FormatAnnouncement(a, "pod", announceToken)
		if err != nil || !bytes.Equal(bytes.TrimSuffix(again, []byte("\n")), bytes.TrimSuffix(b, []byte("\n"))) {
			t.Fatalf("announcement %+v formats to %q, %v; read %q", a, again, err, b)
		}
	})
}
