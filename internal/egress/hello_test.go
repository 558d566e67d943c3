package egress

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// byteCounter is a raw upstream that counts the bytes it receives.
type byteCounter struct {
	mu sync.Mutex
	n  int
}

func (b *byteCounter) got() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// TestTunnelSNI: a plain (not inspected) tunnel reads the client's TLS hello before any byte goes upstream. A hello
// naming another host than the CONNECT (domain fronting) is refused sni-fronting, one without a name for a name
// target sni-missing, and neither reaches the upstream; the CONNECT host's own name, an IP target without a name,
// and a client that does not speak TLS at all pass.
func TestTunnelSNI(t *testing.T) {
	counter := &byteCounter{}
	port := rawUpstream(t, func(c net.Conn) {
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			counter.mu.Lock()
			counter.n += n
			counter.mu.Unlock()
			if err != nil {
				return
			}
		}
	})
	rec := newRecorder(t, map[string][]string{"cdn.test": {"192.88.99.30"}, "hidden.test": {"192.88.99.30"}})
	h := newHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "cdn.test", "192.88.99.30")}, rec)

	hello := func(target, sni string) (upstreamBytes int, blocks []Block) {
		t.Helper()
		before, nb := counter.got(), len(h.reported())
		resp, c, _ := h.connect(target, bearer())
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT %s: %d", target, resp.StatusCode)
		}
		tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12})
		_ = tc.SetDeadline(time.Now().Add(3 * time.Second))
		_ = tc.Handshake() // the raw upstream never answers: the handshake ends with a timeout or the tunnel's close
		_ = c.Close()
		time.Sleep(50 * time.Millisecond)
		return counter.got() - before, h.reported()[nb:]
	}
	for _, tt := range []struct {
		name, target, sni string
		reason            string // "" when the hello goes through
	}{
		{"fronted", "cdn.test:" + port, "hidden.test", ReasonSNIFronting},
		{"fronted by IP target", "192.88.99.30:" + port, "hidden.test", ReasonSNIFronting},
		{"no name", "cdn.test:" + port, "", ReasonSNIMissing},
		{"own name", "cdn.test:" + port, "CDN.test.", ""},
		{"IP target without a name", "192.88.99.30:" + port, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n, blocks := hello(tt.target, tt.sni)
			if tt.reason == "" {
				if n == 0 || len(blocks) != 0 {
					t.Errorf("upstream got %d bytes, blocks %+v; want the hello through", n, blocks)
				}
				return
			}
			if n != 0 {
				t.Errorf("upstream got %d bytes of a refused hello", n)
			}
			if len(blocks) != 1 || blocks[0].Reason != tt.reason {
				t.Errorf("blocks %+v, want one %s", blocks, tt.reason)
			}
			if tt.reason == ReasonSNIFronting && blocks[0].Host != "hidden.test" {
				t.Errorf("block host %q, want the hello's", blocks[0].Host)
			}
		})
	}

	// Not TLS: passes unread (there is no name to front with), bytes intact.
	before := counter.got()
	resp, c, _ := h.connect("cdn.test:"+port, bearer())
	if resp.StatusCode != http.StatusOK {
		t.Fatal(resp.StatusCode)
	}
	_, _ = io.WriteString(c, "SSH-2.0-test\r\n")
	deadline := time.Now().Add(5 * time.Second)
	for counter.got()-before < 14 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := counter.got() - before; got != 14 {
		t.Errorf("a non-TLS tunnel delivered %d bytes, want 14", got)
	}
}

// FuzzReadHello checks that reading a ClientHello from any bytes never panics and never writes.
func FuzzReadHello(f *testing.F) {
	f.Add([]byte{recordHandshake, 3, 1, 0, 5, 1, 0, 0, 1, 0})
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = readHello(&chunked{s: string(b), n: 7})
	})
}
