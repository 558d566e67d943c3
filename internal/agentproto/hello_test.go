package agentproto

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// TestHelloRoundTrip: both kinds (a channel's and an egress connection's) read back as written, and nothing
// past the hello is read.
func TestHelloRoundTrip(t *testing.T) {
	for _, egress := range []bool{false, true} {
		h := Hello{Name: "sandkeep-u-0123456789abcdef01234567", Token: bytes.Repeat([]byte("k"), 32), Egress: egress}
		b, err := AppendHello(nil, h)
		if err != nil {
			t.Fatal(err)
		}
		r := bytes.NewReader(append(b, "frames"...))
		got, err := ReadHello(r)
		if err != nil || got.Name != h.Name || !bytes.Equal(got.Token, h.Token) || got.Egress != egress {
			t.Fatalf("ReadHello = %+v, %v; want %+v", got, err, h)
		}
		if rest, _ := io.ReadAll(r); string(rest) != "frames" {
			t.Fatalf("ReadHello read past the hello: %q left", rest)
		}
	}
}

func TestHelloRefusals(t *testing.T) {
	good, _ := AppendHello(nil, Hello{Name: "p", Token: bytes.Repeat([]byte("t"), 16)})
	for name, b := range map[string][]byte{
		"empty":       nil,
		"magic":       append([]byte("XKCH"), good[4:]...),
		"version":     append(append([]byte("SKCH"), 2), good[5:]...),
		"empty name":  []byte("SKCH\x01\x00"),
		"short token": append([]byte("SKCH\x01\x01p\x0f"), bytes.Repeat([]byte("t"), 15)...),
		"long token":  append([]byte("SKCH\x01\x01p\x81"), bytes.Repeat([]byte("t"), 129)...),
		"cut":         good[:len(good)-1],
	} {
		if _, err := ReadHello(bytes.NewReader(b)); !errors.Is(err, ErrHello) {
			t.Errorf("%s: ReadHello = %v; want ErrHello", name, err)
		}
	}
	if _, err := AppendHello(nil, Hello{Name: "p", Token: []byte("short")}); !errors.Is(err, ErrHello) {
		t.Errorf("AppendHello of a short token = %v; want ErrHello", err)
	}
	if _, err := AppendHello(nil, Hello{Token: bytes.Repeat([]byte("t"), 16)}); !errors.Is(err, ErrHello) {
		t.Errorf("AppendHello without a name = %v; want ErrHello", err)
	}
}

// FuzzReadHello: any input is a hello that encodes back to the bytes read, or ErrHello; never a panic, never a
// read past maxHelloLength.
func FuzzReadHello(f *testing.F) {
	good, _ := AppendHello(nil, Hello{Name: "sandkeep-u-abc", Token: bytes.Repeat([]byte{0xff}, 32)})
	f.Add(good)
	f.Add([]byte("SKCH\x01\x00"))
	f.Add([]byte("SKCH\x01\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		h, err := ReadHello(r)
		if err != nil {
			if !errors.Is(err, ErrHello) {
				t.Fatalf("ReadHello error %v is not ErrHello", err)
			}
			return
		}
		read := len(b) - r.Len()
		if read > maxHelloLength {
			t.Fatalf("read %d bytes, more than a hello holds", read)
		}
		again, err := AppendHello(nil, h)
		if err != nil || !bytes.Equal(again, b[:read]) {
			t.Fatalf("hello %+v re-encodes to %x, %v; read %x", h, again, err, b[:read])
		}
	})
}
