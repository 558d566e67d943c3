package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/client"
)

// TestUserAgent: every request says who sends it: sandkeep-go-client, or what WithUserAgent names (a server's
// access log tells one agent platform from another by it).
func TestUserAgent(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.UserAgent())
		mu.Unlock()
		http.NotFound(w, r)
	}))
	defer ts.Close()
	for _, tc := range []struct {
		opts []client.Option
		want string
	}{
		{nil, "sandkeep-go-client"},
		{[]client.Option{client.WithUserAgent("agent-platform/2.1")}, "agent-platform/2.1"},
	} {
		c, err := client.New(ts.URL, "tok", append(tc.opts, client.WithHTTPClient(ts.Client()))...)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Sandbox(context.Background(), "alice") // the server answers 404: only the request matters
		mu.Lock()
		got := seen[len(seen)-1]
		mu.Unlock()
		if got != tc.want {
			t.Errorf("User-Agent %q, want %q", got, tc.want)
		}
	}
}
