package e2b

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// record is what the front remembers of one E2B sandbox. The sandbox's key is derived (the tenant of the token
// that made it, user "e2b-<id>"), so the record only holds what E2B's API adds to a sandbox.
type record struct {
	ID          string            `json:"id"`
	Tenant      string            `json:"tenant"`
	Template    string            `json:"template"`    // the E2B template id the caller asked for
	OpTemplate  string            `json:"op_template"` // the operator template it maps to ("" the tenant's default)
	Metadata    map[string]string `json:"metadata,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	StartedAt   time.Time         `json:"started_at"`
	EndAt       time.Time         `json:"end_at"`
	AutoPause   bool              `json:"auto_pause,omitempty"`
	Paused      bool              `json:"paused,omitempty"`
	AccessToken string            `json:"access_token"` // the envd access token (connect returns it again)
	TokenID     string            `json:"token_id"`     // the API token that created it
	TokenHash   string            `json:"token_hash"`   // its hash: envd calls re-check that it is still live
	// AllowInternet and Network are E2B's network fields as admitted (network.go): the caller's block over
	// the template's network. Networked says its commands get a network (a network update then waits for
	// none to run).
	AllowInternet *bool        `json:"allow_internet,omitempty"`
	Network       *networkJSON `json:"network,omitempty"`
	Networked     bool         `json:"networked,omitempty"`
}

// user is the sandkeep user of the sandbox's key.
func (r *record) user() string { return userPrefix + r.ID }

const userPrefix = "e2b-"

// state is E2B's state name.
func (r *record) state() string {
	if r.Paused {
		return "paused"
	}
	return "running"
}

// accessOK reports whether token is the sandbox's envd access token.
func (r *record) accessOK(token string) bool {
	a, b := sha256.Sum256([]byte(token)), sha256.Sum256([]byte(r.AccessToken))
	return r.AccessToken != "" && subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// newID returns a sandbox id: 20 lower-case base-36-ish characters, as E2B's ids look.
func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// newAccessToken returns a fresh envd access token.
func newAccessToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return "ea_" + hex.EncodeToString(b)
}

// validID reports whether id could be one newID made; anything else names no sandbox (and never a file).
func validID(id string) bool {
	if len(id) != 20 {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// records keeps one JSON file per sandbox (mode 0600) under a directory of the server's state home, so
// sandboxes, their timeouts and access tokens survive a restart. Writes are atomic (a temporary file renamed into place).
// Names are validated ids, so no caller input becomes a path.
type records struct {
	mu  sync.Mutex // serializes read-modify-write of one process
	dir string
}

func openRecords(dir string) (*records, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("e2b records: %w", err)
	}
	return &records{dir: dir}, nil
}

var errNoRecord = errors.New("no such sandbox")

func (rs *records) get(id string) (*record, error) {
	if !validID(id) {
		return nil, errNoRecord
	}
	b, err := os.ReadFile(filepath.Join(rs.dir, id+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoRecord
	}
	if err != nil {
		return nil, fmt.Errorf("e2b record %s: %w", id, err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("e2b record %s: %w", id, err)
	}
	return &r, nil
}

func (rs *records) put(r *record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(rs.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("e2b record %s: %w", r.ID, err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("e2b record %s: %w", r.ID, err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(rs.dir, r.ID+".json")); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("e2b record %s: %w", r.ID, err)
	}
	return nil
}

// update applies fn to id's record under the lock and writes it back.
func (rs *records) update(id string, fn func(*record) error) (*record, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, err := rs.get(id)
	if err != nil {
		return nil, err
	}
	if err := fn(r); err != nil {
		return nil, err
	}
	return r, rs.put(r)
}

func (rs *records) remove(id string) error {
	if !validID(id) {
		return errNoRecord
	}
	err := os.Remove(filepath.Join(rs.dir, id+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return errNoRecord
	}
	return err
}

// all returns every record (tenant "" for all), oldest first.
func (rs *records) all(tenant string) ([]*record, error) {
	ents, err := os.ReadDir(rs.dir)
	if err != nil {
		return nil, err
	}
	var out []*record
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !validID(id) {
			continue
		}
		r, err := rs.get(id)
		if errors.Is(err, errNoRecord) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		if tenant == "" || r.Tenant == tenant {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.Before(out[j].StartedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}
