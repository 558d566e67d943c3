package lifecycle

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gofrs/flock"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// UIDRange is the operator's range of host uids for sandboxes: with one set, each key's sandbox runs under a
// uid (and a gid of the same number) of its own, so two keys never share an identity on the host and a key's
// workspace (mode 0700) is closed to every other key's sandbox, even one it is bound into.
//
// The zero value is the default (see Config.effectiveUIDs): DefaultUIDRange for the Docker driver when sandkeep
// runs as root and the operator named no User, otherwise off. Off (ParseUIDRange("off")) is off whatever the
// rest: every sandbox runs as Config.User.
type UIDRange struct {
	First int  // the first uid of the range; above 0
	Count int  // how many uids; 0 is the default (or off, with Off)
	Off   bool // the operator turned per-key uids off
}

// UIDsOff is the operator's "off": every sandbox runs as Config.User.
var UIDsOff = UIDRange{Off: true}

// DefaultUIDRange is a range no distribution gives its users (they start at 1000 and rarely pass 60000) and
// that subuid ranges usually start above (100000 + 65536 per user): 200000-265535.
var DefaultUIDRange = UIDRange{First: 200000, Count: 65536}

// effectiveUIDs is the range c's sandboxes on driver drv ("docker", "kubernetes", ...) run under (see
// EffectiveUIDs).
func (c *Config) effectiveUIDs(drv string) UIDRange {
	r, _ := EffectiveUIDs(c.UIDs, c.User, drv)
	return r
}

// EffectiveUIDs is the per-key uid range sandboxes on driver drv run under, given the operator's range r and
// User user: r when set, none when r is UIDsOff, and by default DefaultUIDRange when all of these hold: the
// driver is Docker (the uid is then a host uid; a pod's uid is the cluster's, whose workspaces are claims, not
// host directories), sandkeep runs as root (handing a workspace to another uid needs CAP_CHOWN), and the
// operator named no User (naming one identity for every sandbox is asking for that identity). When it is off,
// why says why, in words (doctor shows it).
func EffectiveUIDs(r UIDRange, user, drv string) (eff UIDRange, why string) {
	switch {
	case r.Off:
		return UIDRange{}, "the operator turned them off"
	case r.Count > 0:
		return r, ""
	case drv != "docker":
		return UIDRange{}, "the " + drv + " driver's uids are not host uids"
	case os.Geteuid() != 0:
		return UIDRange{}, "sandkeep is not root and cannot hand a workspace to another uid"
	case user != "":
		return UIDRange{}, "the operator named one sandbox user, " + user
	}
	return DefaultUIDRange, ""
}

// maxUID is the last uid a range may reach: 2^31-2, below the kernel's (uid_t)-1 and signed-int trouble.
const maxUID = 1<<31 - 2

// ParseUIDRange reads "FIRST-LAST" (inclusive), e.g. "200000-265535"; "off" is off; "" is the default.
func ParseUIDRange(s string) (UIDRange, error) {
	switch s {
	case "":
		return UIDRange{}, nil
	case "off":
		return UIDsOff, nil
	}
	a, b, ok := strings.Cut(s, "-")
	first, ferr := strconv.Atoi(a)
	last, lerr := strconv.Atoi(b)
	if !ok || ferr != nil || lerr != nil || first > last {
		return UIDRange{}, fault.New(fault.InvalidArgument, "write it as FIRST-LAST, e.g. 200000-265535, or off",
			"sandbox uid range %q is not FIRST-LAST", s)
	}
	r := UIDRange{First: first, Count: last - first + 1}
	return r, r.check()
}

// String is "FIRST-LAST", "off", or "" for the default.
func (r UIDRange) String() string {
	if r.Off {
		return "off"
	}
	if r.Count == 0 {
		return ""
	}
	return fmt.Sprintf("%d-%d", r.First, r.First+r.Count-1)
}

func (r UIDRange) check() error {
	if r.Count == 0 && r.First == 0 {
		return nil
	}
	if r.Off {
		return fault.New(fault.PostureRefused, "give a range or off, not both", "sandbox uid range %d-%d is also off",
			r.First, r.First+r.Count-1)
	}
	if r.First <= 0 || r.Count <= 0 || r.First > maxUID-r.Count+1 {
		return fault.New(fault.PostureRefused, "use a range above 0 that ends by 2147483646, e.g. 200000-265535",
			"sandbox uid range %s (%d uids from %d) is refused", r, r.Count, r.First)
	}
	return nil
}

// uidsFile records which key holds which uid of the range ("<key hex> <uid>" a line); uidsLock serializes the
// processes sharing a state home while they read and extend it.
const (
	uidsFile = "uids"
	uidsLock = "uids.lock"
)

// HostIDTaken reports whether uid is a host user's or gid a host group's (through the host's user database): a
// uid of the range is never given to a sandbox when a host account has it.
func HostIDTaken(id int) bool {
	s := strconv.Itoa(id)
	if _, err := user.LookupId(s); err == nil {
		return true
	}
	if _, err := user.LookupGroupId(s); err == nil {
		return true
	}
	return false
}

// AllocateUID returns key's uid in r: the one recorded for it in the home, or a new one. A new uid starts from a
// position derived from the key (so the same key tends to get the same uid in any home) and probes on past uids
// recorded for other keys and uids taken reports (host accounts). The record is what makes it stable: a hash
// alone would collide (two keys in 65536 uids share one with even odds past about 300 keys).
func (h *Home) AllocateUID(key identity.Key, r UIDRange, taken func(id int) bool) (int, error) {
	if err := r.check(); err != nil {
		return 0, err
	}
	if r.Count == 0 {
		return 0, errors.New("allocate uid: no range")
	}
	lock := flock.New(filepath.Join(h.sandboxes(), uidsLock))
	if err := lock.Lock(); err != nil {
		return 0, fmt.Errorf("uid allocation lock: %w", err)
	}
	defer lock.Unlock()
	path := filepath.Join(h.sandboxes(), uidsFile)
	byKey, used, err := readUIDs(path)
	if err != nil {
		return 0, err
	}
	in := func(uid int) bool { return uid >= r.First && uid < r.First+r.Count }
	if uid, ok := byKey[key.Hex()]; ok && in(uid) && !taken(uid) {
		return uid, nil
	}
	sum := sha256.Sum256([]byte(key.Hex()))
	start := int(binary.BigEndian.Uint64(sum[:8]) % uint64(r.Count))
	for i := range r.Count {
		uid := r.First + (start+i)%r.Count
		if _, ok := used[uid]; ok || taken(uid) {
			continue
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return 0, fmt.Errorf("uid allocation: %w", err)
		}
		_, werr := fmt.Fprintf(f, "%s %d\n", key.Hex(), uid)
		serr := f.Sync()
		cerr := f.Close()
		if err := errors.Join(werr, serr, cerr); err != nil {
			return 0, fmt.Errorf("uid allocation: %w", err)
		}
		return uid, nil
	}
	return 0, fault.New(fault.SandboxCapacity, "widen the operator's sandbox uid range",
		"every uid of the sandbox uid range %s is taken", r)
}

// readUIDs reads the allocation file; the last line for a key wins (a key re-allocated after the range changed).
func readUIDs(path string) (byKey map[string]int, used map[int]string, err error) {
	byKey, used = map[string]int{}, map[int]string{}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return byKey, used, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("uid allocation: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		uid, err := strconv.Atoi(v)
		if !ok || err != nil || len(k) != 64 {
			continue // a torn last line of a crashed writer
		}
		if old, ok := byKey[k]; ok {
			delete(used, old)
		}
		byKey[k] = uid
		used[uid] = k
	}
	return byKey, used, nil
}
