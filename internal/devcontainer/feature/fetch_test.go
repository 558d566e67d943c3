package feature

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// dialLog records every address a Registry dialled. It connects only to loopback (the test's own servers):
// any other address is recorded and fails, so even a broken check sends nothing off this host.
type dialLog struct {
	mu    sync.Mutex
	addrs []string
}

func (l *dialLog) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	l.mu.Lock()
	l.addrs = append(l.addrs, addr)
	l.mu.Unlock()
	if ap, err := netip.ParseAddrPort(addr); err != nil || !ap.Addr().IsLoopback() {
		return nil, errors.New("the test dials loopback only")
	}
	return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
}

func (l *dialLog) dialled() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.addrs...)
}

// TestRegistryRefusedAddresses: a registry the repository names on a refused address (the metadata address,
// loopback by name, an operator's range) is refused before anything is dialled, with FEATURE_UNAVAILABLE that
// names the feature and not the address it resolved to (issue 22, finding 6: any registry host was fetched
// from, loopback over plain HTTP).
func TestRegistryRefusedAddresses(t *testing.T) {
	for _, tc := range []struct{ name, id string }{
		{"metadata", "169.254.169.254/features/x:1"},
		{"loopback literal", "127.0.0.1:5000/features/x:1"},
		{"loopback name", "localhost:5000/features/x:1"},
		{"private", "10.1.2.3/features/x:1"},
		{"operator's range", "198.51.7.9/features/x:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log dialLog
			reg := &Registry{dial: log.dial, Refused: []netip.Prefix{netip.MustParsePrefix("198.51.0.0/16")}}
			_, err := Resolve(t.Context(), Source{Fetcher: reg}, []Requested{{ID: tc.id}})
			if fault.CodeOf(err) != fault.FeatureUnavailable || !strings.Contains(err.Error(), tc.id) ||
				!strings.Contains(err.Error(), "does not connect to") {
				t.Fatalf("err = %v, want FEATURE_UNAVAILABLE naming the feature and the refusal", err)
			}
			if d := log.dialled(); len(d) != 0 {
				t.Fatalf("dialled %v before refusing", d)
			}
		})
	}
}

// TestRegistryRedirectRefused: an allowlisted registry (the test's own, on loopback) that redirects to another
// loopback server of the test's, or to the metadata address, is refused at that hop: the other server is never
// dialled or hit, and the error echoes neither the redirect's address nor what the registry answered.
func TestRegistryRedirectRefused(t *testing.T) {
	var hits atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte("secret-of-the-other-server"))
	}))
	defer other.Close()
	otherAddr := other.Listener.Addr().String()
	for _, target := range []string{
		other.URL + "/leak-marker",
		"https://" + otherAddr + "/leak-marker",
		"http://169.254.169.254/latest/meta-data/leak-marker",
		"https://169.254.169.254/latest/meta-data/leak-marker",
	} {
		t.Run(target, func(t *testing.T) {
			reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v2/" {
					w.WriteHeader(http.StatusOK)
					return
				}
				w.Header().Set("Content-Type", "text/x-leak-marker")
				http.Redirect(w, r, target, http.StatusTemporaryRedirect)
			}))
			defer reg.Close()
			host := reg.Listener.Addr().String()
			var log dialLog
			r := &Registry{Allow: []string{host}, dial: log.dial}
			id := host + "/features/hello:1"
			_, err := Resolve(t.Context(), Source{Fetcher: r}, []Requested{{ID: id}})
			if fault.CodeOf(err) != fault.FeatureUnavailable || !strings.Contains(err.Error(), "redirected") {
				t.Fatalf("err = %v, want FEATURE_UNAVAILABLE for the redirect", err)
			}
			for _, leak := range []string{"leak-marker", otherAddr, "169.254.169.254", "text/x-"} {
				if strings.Contains(err.Error(), leak) {
					t.Errorf("the error echoes %q: %v", leak, err)
				}
			}
			for _, a := range log.dialled() {
				if a != host {
					t.Errorf("dialled %s, not the registry %s", a, host)
				}
			}
			if n := hits.Load(); n != 0 {
				t.Fatalf("the redirect's server was hit %d times", n)
			}
		})
	}
}

// TestResolveMemoryBounded: features of large (sparse) files are spooled to disk, not held in memory: two of
// 150 MiB each are resolved with a few MiB allocated, and three of 180 MiB (over MaxTotalFeatureBytes
// together) are refused. Issue 22 (finding 7) found 32 such features taking 1.8 GB of RSS. Memory is measured
// as the bytes the Go heap allocated during Resolve (runtime.MemStats.TotalAlloc): the old code's io.ReadAll
// allocated at least each file's size.
func TestResolveMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes half a GiB to a temporary directory")
	}
	repo := t.TempDir()
	feat := func(name string, size int64) string {
		dir := filepath.Join(repo, ".devcontainer", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, MetadataFile), []byte(`{"id": "`+name+`", "version": "1.0.0"}`), 0o644)
		os.WriteFile(filepath.Join(dir, InstallScript), []byte("#!/bin/sh\n"), 0o755)
		f, err := os.Create(filepath.Join(dir, "blob"))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil { // sparse: a few bytes of repository, size bytes to read
			t.Fatal(err)
		}
		f.Close()
		return "./" + name
	}
	root, err := os.OpenRoot(repo)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	resolve := func(ids ...string) ([]*Feature, uint64, error) {
		req := make([]Requested, len(ids))
		for i, id := range ids {
			req[i] = Requested{ID: id}
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fs, err := Resolve(t.Context(), Source{Repo: root, DcDir: ".devcontainer", Spool: &Spool{Dir: t.TempDir()}}, req)
		runtime.ReadMemStats(&after)
		return fs, after.TotalAlloc - before.TotalAlloc, err
	}

	fs, alloc, err := resolve(feat("a", 150<<20), feat("b", 150<<20))
	if err != nil {
		t.Fatal(err)
	}
	if alloc > 32<<20 {
		t.Errorf("resolving 300 MiB of feature files allocated %d MiB", alloc>>20)
	}
	for _, f := range fs {
		for _, fl := range f.Files {
			if fl.Path == "blob" && (fl.Size != 150<<20 || fl.Data != nil) {
				t.Errorf("%s/blob: size %d, %d bytes in memory", f.Ref.ID, fl.Size, len(fl.Data))
			}
		}
	}
	t.Logf("two features of 150 MiB: %d KiB allocated", alloc>>10)

	_, _, err = resolve(feat("c", 180<<20), feat("d", 180<<20), feat("e", 180<<20))
	if fault.CodeOf(err) != fault.FeatureInvalid || !strings.Contains(err.Error(), "together") {
		t.Fatalf("540 MiB of features: err = %v, want FEATURE_INVALID over the total bound", err)
	}
}
