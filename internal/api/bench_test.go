package api

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/service"
)

// BenchmarkExecOverhead compares one warm command through the backend directly and through the API (auth,
// decode, limits, metrics, access log, JSON answer, a keep-alive HTTP/1.1 round trip). The difference is what
// the API adds; the fake backend makes the command itself nearly free.
func BenchmarkExecOverhead(b *testing.B) {
	e := newEnv(b, nil)
	key, _ := sandkeep.NewKey("acme", "alice")
	ctx := context.Background()
	if _, err := e.be.Exec(ctx, key, service.AdmitRequest{}, sandkeep.ExecRequest{Argv: []string{"echo", "warm"}}); err != nil {
		b.Fatal(err)
	}
	b.Run("backend", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.be.Exec(ctx, key, service.AdmitRequest{}, sandkeep.ExecRequest{Argv: []string{"echo", "hi"}}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("api", func(b *testing.B) {
		hc := e.ts.Client()
		for b.Loop() {
			r, _ := http.NewRequest("POST", e.ts.URL+"/v1/sandboxes/alice/exec", strings.NewReader(`{"argv":["echo","hi"]}`))
			r.Header.Set("Authorization", "Bearer "+e.tok)
			resp, err := hc.Do(r)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatal(resp.Status)
			}
		}
	})
}
