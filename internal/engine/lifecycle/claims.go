package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// A claim record says that a key's sandbox is a warm pool member it claimed (pool.go): the member's container
// (which keeps its name) and the member's workspace, volumes, channel directory and quota image, all named by the
// member's key and baked into its container at create time, are the key's from then on. It is the one place
// that maps the two; Home's path functions read it, so every caller (the lifecycle, the file API, another
// process on the same home) finds the key's files and sandbox where they are.
//
// It lives in <home>/claims/<key hex>.json, with a copy under the member's key (m-<member hex>.json) so that a
// listed container can be traced back to its key. The copy is written first and the key's record last, each
// whole through a rename: the key's record is the claim, and a copy whose key's record does not name the member
// back (a process killed between the two) is no claim. Older versions wrote a pending record, renamed the
// member to the key's name, then wrote it done; a pending record left by them is settled by reconcileClaim.
type claimRecord struct {
	Tenant   string `json:"tenant"`   // the key's
	User     string `json:"user"`     //
	Template string `json:"template"` // the member's pool
	Member   string `json:"member"`   // the member's random id: identity.Member(Template, Member)
	Done     bool   `json:"done"`     // the claim is made; false: an older version's, cut around its rename
}

func (r claimRecord) member() identity.Key { return identity.Member(r.Template, r.Member) }

func (h *Home) claimPath(k identity.Key) string {
	return filepath.Join(h.Dir, "claims", k.Hex()+".json")
}

func (h *Home) memberClaimPath(member identity.Key) string {
	return filepath.Join(h.Dir, "claims", "m-"+member.Hex()+".json")
}

// phys is the key whose names k's files and sandbox configuration use: the member k claimed (a done record), or
// k itself. A done record only goes away with the key's workspace, so positive answers are cached.
func (h *Home) phys(k identity.Key) identity.Key {
	if k.Tenant == "" { // a member's own key: never a claimant
		return k
	}
	if v, ok := h.claimed.Load(k.Hex()); ok {
		return v.(identity.Key)
	}
	rec, ok := h.readClaim(k)
	if !ok || !rec.Done {
		return k
	}
	mk := rec.member()
	h.claimed.Store(k.Hex(), mk)
	return mk
}

// readClaim reads k's claim record; a missing or unreadable one is no claim.
func (h *Home) readClaim(k identity.Key) (claimRecord, bool) {
	return readClaimFile(h.claimPath(k))
}

func readClaimFile(path string) (claimRecord, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return claimRecord{}, false
	}
	var rec claimRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.Template == "" || rec.Member == "" {
		return claimRecord{}, false
	}
	return rec, true
}

// writeClaim writes k's record (and the member's copy) whole, through a rename.
func (h *Home) writeClaim(k identity.Key, rec claimRecord) error {
	if err := os.MkdirAll(filepath.Join(h.Dir, "claims"), 0o700); err != nil {
		return fmt.Errorf("claim record: %w", err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	for i, p := range []string{h.memberClaimPath(rec.member()), h.claimPath(k)} {
		if i == 1 && claimHook != nil {
			claimHook("indexed")
		}
		if err := replaceFile(p, bytes.NewReader(b), 0o600); err != nil {
			return fmt.Errorf("claim record: %w", err)
		}
	}
	if rec.Done {
		h.claimed.Store(k.Hex(), rec.member())
	}
	return nil
}

// dropClaim removes k's claim record and the member's copy.
func (h *Home) dropClaim(k identity.Key) {
	if rec, ok := h.readClaim(k); ok {
		os.Remove(h.memberClaimPath(rec.member()))
	}
	os.Remove(h.claimPath(k))
	h.claimed.Delete(k.Hex())
}

// dropMemberClaim removes member's copy of a record.
func (h *Home) dropMemberClaim(member identity.Key) { os.Remove(h.memberClaimPath(member)) }

// claimant is the key that claimed member, if any: the member's copy names a key whose own done record names
// the member back.
func (h *Home) claimant(member identity.Key) (identity.Key, bool) {
	rec, ok := readClaimFile(h.memberClaimPath(member))
	if !ok || !rec.Done || rec.member() != member {
		return identity.Key{}, false
	}
	k, err := identity.New(rec.Tenant, rec.User)
	if err != nil {
		return identity.Key{}, false
	}
	if own, ok := h.readClaim(k); !ok || !own.Done || own.member() != member {
		return identity.Key{}, false
	}
	return k, true
}

// pendingClaims lists the keys whose claim records are not done.
func (h *Home) pendingClaims() ([]identity.Key, error) {
	ents, err := os.ReadDir(filepath.Join(h.Dir, "claims"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("claim records: %w", err)
	}
	var out []identity.Key
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, "m-") || !strings.HasSuffix(name, ".json") {
			continue
		}
		rec, ok := readClaimFile(filepath.Join(h.Dir, "claims", name))
		if !ok || rec.Done {
			continue
		}
		if k, err := identity.New(rec.Tenant, rec.User); err == nil && k.Hex()+".json" == name {
			out = append(out, k)
		}
	}
	return out, nil
}

// On a driver that keeps claims itself (driver.ClaimKeeper: the kubernetes driver, whose replicas have homes of
// their own) the engine's record of the member is the claim: one compare-and-swap of the API server's, made
// before anything of this home is written. The home's record is then a cache of it, written after, repaired
// from the engine when missing (inspectKey, adoptMembers) and dropped when the engine says otherwise.

// claimKeeper is the driver as a ClaimKeeper, when it keeps the claims.
func (m *Manager) claimKeeper() (driver.ClaimKeeper, bool) {
	ck, ok := m.drv.(driver.ClaimKeeper)
	return ck, ok
}

// claimedInEngine: a ClaimKeeper reported sb as key's.
func claimedInEngine(sb *driver.Sandbox, key identity.Key) bool {
	c, ok := driver.ClaimOf(sb)
	return ok && c.Key == key.Hex()
}

// noteClaim writes the home's record of key's claim of the member sb (a ClaimKeeper's report), so that this
// home's names of key's files and uid follow the member's. A failure leaves the record to the next lookup.
func (m *Manager) noteClaim(key identity.Key, sb *driver.Sandbox) {
	rec := claimRecord{Tenant: key.Tenant, User: key.User, Template: sb.Labels[driver.LabelPool],
		Member: memberIDOf(sb.Labels[driver.LabelUser]), Done: true}
	if rec.Template == "" || rec.Member == "" || rec.member().Hex() != sb.Labels[driver.LabelKey] {
		return
	}
	if cur, ok := m.home.readClaim(key); ok && cur == rec {
		return
	}
	if err := m.home.writeClaim(key, rec); err != nil {
		m.cfg.Logger.Warn("warm pool: claim record not written", "key", key.Short(), "sandbox", sb.Name, "err", err)
	}
}

// removeSandbox removes sb and, on a driver that keeps workspaces (a Kubernetes claim), its workspace: a pool
// member's goes with it.
func (m *Manager) removeSandbox(ctx context.Context, sb *driver.Sandbox) error {
	if err := m.drv.Remove(ctx, sb); err != nil {
		return err
	}
	if wr, ok := m.drv.(driver.WorkspaceRemover); ok {
		return wr.RemoveWorkspace(ctx, sb.Name)
	}
	return nil
}
