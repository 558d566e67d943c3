package egress

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestStalledBodies: requests whose bodies must be scanned (a policy with a credential) that send almost the
// whole scanned start and then stall hold at most scanSlots scanned starts at once, measured on the heap, and are
// answered 408 once the read deadline passes, each in turn; none reaches the upstream.
func TestStalledBodies(t *testing.T) {
	const conns = 40
	up := newUpstream(t, false)
	rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}, "other.test": {"192.88.99.11"}})
	h := &harness{t: t, rec: rec}
	p, err := New(Config{Policy: Policy{Mode: ModeAllowlist, Rules: rules(t, "api.test", "other.test"),
		Credentials: []Credential{{Name: "K", Placeholder: NewPlaceholder("K"), Value: "value-of-k-1234", Hosts: rules(t, "api.test")}}},
		Token: testToken, Resolver: rec, Dial: rec.Dial})
	if err != nil {
		t.Fatal(err)
	}
	p.bodyTimeout = 1500 * time.Millisecond
	h.start(p)

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	chunk := bytes.Repeat([]byte("a"), bodyScanLimit-1)
	head := "POST http://other.test:" + up.port() + "/ HTTP/1.1\r\nHost: other.test\r\nProxy-Authorization: " + bearer() +
		"\r\nContent-Length: " + strconv.Itoa(2*bodyScanLimit) + "\r\n\r\n"
	var wg sync.WaitGroup
	statuses := make(chan int, conns)
	for range conns {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		wg.Go(func() {
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			_, _ = c.Write([]byte(head))
			_, _ = c.Write(chunk) // and then nothing: the body stalls
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				statuses <- 0
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	time.Sleep(700 * time.Millisecond) // every connection has sent its start; the first slots hold theirs
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusRequestTimeout {
			t.Errorf("a stalled body was answered %d, want 408", s)
		}
	}
	held := int64(during.HeapInuse) - int64(before.HeapInuse)
	// Without the slots every connection's scanned start is held at once: 40 MiB and more.
	if bound := int64(3 * scanSlots * bodyScanLimit); held > bound {
		t.Errorf("%d stalled bodies held %d MiB of heap, want under %d MiB", conns, held>>20, bound>>20)
	} else {
		t.Logf("%d stalled bodies held %.1f MiB of heap", conns, float64(held)/(1<<20))
	}
	if len(up.seen()) != 0 {
		t.Errorf("the upstream got %d requests", len(up.seen()))
	}
}
