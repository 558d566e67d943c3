package lifecycle

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

func uidKey(t *testing.T, i int) identity.Key {
	t.Helper()
	k, err := identity.New("t", fmt.Sprintf("u%d", i))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestAllocateUID: keys get distinct uids of the range, never one a host account has, the same one again (from
// another process's view of the same home, concurrently too), and a full range is SANDBOX_CAPACITY.
func TestAllocateUID(t *testing.T) {
	dir := t.TempDir()
	home, err := OpenHome(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := UIDRange{First: 300000, Count: 5}
	host := func(id int) bool { return id == 300002 } // a host user holds this one
	got := make([]int, 4)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range 4 {
		wg.Go(func() {
			// A Home of its own per goroutine: the lock is the file's, as between processes.
			h, err := OpenHome(dir)
			if err != nil {
				errs[i] = err
				return
			}
			got[i], errs[i] = h.AllocateUID(uidKey(t, i), r, host)
		})
	}
	wg.Wait()
	seen := map[int]bool{}
	for i, uid := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if uid < r.First || uid >= r.First+r.Count || uid == 300002 || seen[uid] {
			t.Fatalf("uids %v: %d is outside the range, a host user's or shared", got, uid)
		}
		seen[uid] = true
	}
	for i := range 4 {
		again, err := home.AllocateUID(uidKey(t, i), r, host)
		if err != nil || again != got[i] {
			t.Fatalf("key %d: %d then %d (%v)", i, got[i], again, err)
		}
	}
	_, err = home.AllocateUID(uidKey(t, 9), r, host)
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Code != fault.SandboxCapacity {
		t.Fatalf("full range: %v, want SANDBOX_CAPACITY", err)
	}
	// A torn line (a writer that crashed) is ignored.
	f, err := os.OpenFile(filepath.Join(dir, uidsFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("abc 12")
	f.Close()
	if again, err := home.AllocateUID(uidKey(t, 0), r, host); err != nil || again != got[0] {
		t.Fatalf("after a torn line: %d, %v", again, err)
	}
}

func TestParseUIDRange(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want UIDRange
		ok   bool
	}{
		{"", UIDRange{}, true},
		{"off", UIDsOff, true},
		{"OFF", UIDRange{}, false},
		{"200000-265535", DefaultUIDRange, true},
		{"5-5", UIDRange{First: 5, Count: 1}, true},
		{"0-10", UIDRange{}, false},
		{"10-5", UIDRange{}, false},
		{"2147483000-2147483647", UIDRange{}, false},
		{"a-b", UIDRange{}, false},
		{"100", UIDRange{}, false},
	} {
		got, err := ParseUIDRange(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseUIDRange(%q) = %+v, %v", tc.in, got, err)
		}
	}
}

// TestEffectiveUIDs: per-key uids are on by default for the Docker driver when sandkeep runs as root and no User
// was named; an operator's range always applies, "off" never, and other drivers get none by default.
func TestEffectiveUIDs(t *testing.T) {
	root := os.Geteuid() == 0
	def := UIDRange{}
	if root {
		def = DefaultUIDRange
	}
	own := UIDRange{First: 300000, Count: 10}
	for _, tc := range []struct {
		name string
		cfg  Config
		drv  string
		want UIDRange
	}{
		{"default on docker", Config{}, "docker", def},
		{"named user", Config{User: "1000:1000"}, "docker", UIDRange{}},
		{"off", Config{UIDs: UIDsOff}, "docker", UIDRange{}},
		{"operator range", Config{UIDs: own, User: "1000:1000"}, "docker", own},
		{"operator range, kubernetes", Config{UIDs: own}, "kubernetes", own},
		{"default on kubernetes", Config{}, "kubernetes", UIDRange{}},
		{"default on fake", Config{}, "fake", UIDRange{}},
	} {
		if got := tc.cfg.effectiveUIDs(tc.drv); got != tc.want {
			t.Errorf("%s (root %v): %+v, want %+v", tc.name, root, got, tc.want)
		}
	}
	if err := (UIDRange{First: 5, Count: 1, Off: true}).check(); fault.CodeOf(err) != fault.PostureRefused {
		t.Errorf("a range that is also off: %v, want POSTURE_REFUSED", err)
	}
}

// FuzzParseUIDRange: a range that parses is within bounds, prints back to itself, and never includes root.
func FuzzParseUIDRange(f *testing.F) {
	for _, s := range []string{"200000-265535", "1-1", "0-0", "-5", "5-", "99999999999999999999-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseUIDRange(s)
		if err != nil || r.Count == 0 {
			if err == nil && r != (UIDRange{}) && r != UIDsOff {
				t.Fatalf("%q parsed to %+v", s, r)
			}
			return
		}
		if r.First <= 0 || r.First+r.Count-1 > maxUID {
			t.Fatalf("%q parsed to %+v", s, r)
		}
		if again, err := ParseUIDRange(r.String()); err != nil || again != r {
			t.Fatalf("%q -> %s -> %+v, %v", s, r, again, err)
		}
	})
}
