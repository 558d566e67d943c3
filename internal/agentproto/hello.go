package agentproto

import (
	"errors"
	"fmt"
	"io"
)

// The hello opens an agent channel over the network (the kubernetes driver's pods dial the sandkeep server): the
// pod's name and the per-pod token its agent read once at start. It is sent once, by the agent, before any
// frame; the server believes the connection only when the token is that pod's and the peer address is the pod's.
//
//	"SKCH" | version (1 byte) | name length (1 byte) | name | token length (1 byte) | token
//
// An egress connection (the agent's forwarder of the sandbox's 127.0.0.1:3128, which the server hands to that
// sandbox's egress proxy) opens with the same hello under the magic "SKEG": the same port, the same per-pod
// authentication, and no frames after it, only the proxied bytes.
//
// Names are Kubernetes object names (at most 253 bytes); tokens are 16 to 128 bytes.
const (
	helloMagic     = "SKCH"
	egressMagic    = "SKEG"
	HelloVersion   = 1
	MaxHelloName   = 253
	MinHelloToken  = 16
	MaxHelloToken  = 128
	maxHelloLength = len(helloMagic) + 3 + MaxHelloName + MaxHelloToken
)

// ErrHello marks a hello that is not one: wrong magic or version, a bad length, or a cut stream.
var ErrHello = errors.New("bad agent channel hello")

// Hello is what the agent says first on a network channel.
type Hello struct {
	Name  string // the pod's name
	Token []byte // the pod's channel token
	// Egress marks an egress connection: the bytes after the hello are the proxy's, not frames.
	Egress bool
}

// AppendHello encodes h; it refuses a name or token outside the bounds.
func AppendHello(b []byte, h Hello) ([]byte, error) {
	if len(h.Name) == 0 || len(h.Name) > MaxHelloName {
		return nil, fmt.Errorf("%w: name of %d bytes", ErrHello, len(h.Name))
	}
	if len(h.Token) < MinHelloToken || len(h.Token) > MaxHelloToken {
		return nil, fmt.Errorf("%w: token of %d bytes", ErrHello, len(h.Token))
	}
	magic := helloMagic
	if h.Egress {
		magic = egressMagic
	}
	b = append(b, magic...)
	b = append(b, HelloVersion, byte(len(h.Name)))
	b = append(b, h.Name...)
	b = append(b, byte(len(h.Token)))
	return append(b, h.Token...), nil
}

// ReadHello reads one hello from r, reading no byte past it (the frames follow on the same stream).
func ReadHello(r io.Reader) (Hello, error) {
	var head [len(helloMagic) + 2]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return Hello{}, fmt.Errorf("%w: %v", ErrHello, err)
	}
	magic := string(head[:len(helloMagic)])
	if magic != helloMagic && magic != egressMagic {
		return Hello{}, fmt.Errorf("%w: no magic", ErrHello)
	}
	if head[len(helloMagic)] != HelloVersion {
		return Hello{}, fmt.Errorf("%w: version %d, want %d", ErrHello, head[len(helloMagic)], HelloVersion)
	}
	n := int(head[len(helloMagic)+1])
	if n == 0 {
		return Hello{}, fmt.Errorf("%w: empty name", ErrHello)
	}
	// The name and the token's length byte together.
	buf := make([]byte, n+1)
	if _, err := io.ReadFull(r, buf); err != nil {
		return Hello{}, fmt.Errorf("%w: %v", ErrHello, err)
	}
	t := int(buf[n])
	if t < MinHelloToken || t > MaxHelloToken {
		return Hello{}, fmt.Errorf("%w: token of %d bytes", ErrHello, t)
	}
	token := make([]byte, t)
	if _, err := io.ReadFull(r, token); err != nil {
		return Hello{}, fmt.Errorf("%w: %v", ErrHello, err)
	}
	return Hello{Name: string(buf[:n]), Token: token, Egress: magic == egressMagic}, nil
}
