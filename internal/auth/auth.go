// Package auth is API tokens as the server sees them: making one (a secret shown once, only its hash stored),
// parsing the scopes and expiry an operator asks for, and checking the Authorization header of a request.
//
// A token is "skt_" followed by 43 characters of unpadded base64url: 32 bytes from crypto/rand. The store keeps
// its SHA-256 in hex; a request's token is hashed and looked up on every request, so a revocation or an expiry
// takes effect on the next one. Every reason to refuse a request's token (none, malformed, unknown, revoked,
// expired) is the same error, so a caller learns nothing about which tokens exist.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Scopes a token can carry. Admin implies the others.
const (
	ScopeExec  = store.ScopeExec  // run commands in the tenant's sandboxes
	ScopeFiles = store.ScopeFiles // read and write files in them
	ScopeRead  = store.ScopeRead  // list and inspect sandboxes, runs and events
	ScopeAdmin = store.ScopeAdmin // everything, stopping and removing sandboxes included
)

// allScopes is every scope, in the order help texts list them.
var allScopes = []string{ScopeExec, ScopeFiles, ScopeRead, ScopeAdmin}

// DefaultScopes returns the scopes of a token created without any: exec, files, read (not admin).
func DefaultScopes() []string { return []string{ScopeExec, ScopeFiles, ScopeRead} }

// Token status, as `sandkeep token list` shows it.
const (
	StatusLive    = "live"
	StatusRevoked = "revoked"
	StatusExpired = "expired"
)

// Prefix starts every token, so a leaked one is recognisable (secret scanners, logs).
const Prefix = "skt_"

// secretBytes is how much randomness a token carries.
const secretBytes = 32

// tokenLen is the length of a token: Prefix and the unpadded base64url of secretBytes.
var tokenLen = len(Prefix) + base64.RawURLEncoding.EncodedLen(secretBytes)

// MaxExpiry bounds how far ahead a token may expire.
const MaxExpiry = 10 * 365 * 24 * time.Hour

// MinExpiry is the shortest lifetime ParseExpiry accepts: a token that expires before anyone can use it is a
// typo ("30s" for "30d").
const MinExpiry = time.Minute

// MaxNameLen bounds a token's name, in bytes.
const MaxNameLen = 128

// Generate returns a new secret token: Prefix and 43 characters of unpadded base64url encoding 32 bytes from
// crypto/rand. It is shown once; only Hash(token) is stored.
func Generate() string {
	b := make([]byte, secretBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails: it crashes the program if the kernel cannot supply
	return Prefix + base64.RawURLEncoding.EncodeToString(b)
}

// Hash returns the lower-case hex SHA-256 of token, the only form of it the store keeps. A token is 256
// random bits, so a plain (unsalted, fast) hash is enough: there is nothing to guess.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// NewID returns a new public token id: "tok_" and 16 lower-case hex digits.
func NewID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return store.TokenIDPrefix + hex.EncodeToString(b)
}

// wellFormed reports whether s has the shape of a token Generate makes, so garbage never reaches the store.
func wellFormed(s string) bool {
	rest, ok := strings.CutPrefix(s, Prefix)
	if !ok || len(s) != tokenLen {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

const scopesHint = "use a comma-separated list of exec, files, read, admin (admin implies the others), e.g. --scopes exec,read"

// ParseScopes parses a comma-separated list of scopes ("exec,files"). Spaces around names are ignored and names
// are case-insensitive; a scope named twice counts once; the order given is kept. An empty (or blank) list
// means DefaultScopes. An unknown or empty name is an INVALID_ARGUMENT fault.
func ParseScopes(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return DefaultScopes(), nil
	}
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		sc := strings.ToLower(strings.TrimSpace(part))
		switch {
		case sc == "":
			return nil, fault.New(fault.InvalidArgument, scopesHint, "scope list %q has an empty entry", s)
		case !slices.Contains(allScopes, sc):
			return nil, fault.New(fault.InvalidArgument, scopesHint, "unknown scope %q", strings.TrimSpace(part))
		case !slices.Contains(out, sc):
			out = append(out, sc)
		}
	}
	return out, nil
}

const expiryHint = "use a number of days, hours or minutes such as 30d, 12h or 90m (between 1m and 3650d), or never"

// ParseExpiry parses how long a new token lives: "30d" (days), or a Go duration such as "12h", "90m" or
// "1h30m". "never" and "" mean the token does not expire: 0 is returned. Anything else, and lifetimes outside
// MinExpiry..MaxExpiry, is an INVALID_ARGUMENT fault.
func ParseExpiry(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.EqualFold(s, "never") {
		return 0, nil
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		// Digits only: no sign, no fraction, no "1d12h". Bound the count before multiplying, so it cannot wrap.
		n, err := strconv.ParseUint(days, 10, 32)
		if err != nil {
			return 0, fault.New(fault.InvalidArgument, expiryHint, "expiry %q is not a duration", s)
		}
		if n > uint64(MaxExpiry/(24*time.Hour)) {
			return 0, fault.New(fault.InvalidArgument, expiryHint, "expiry %s is more than 10 years away", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fault.New(fault.InvalidArgument, expiryHint, "expiry %q is not a duration", s)
		}
	}
	switch {
	case d <= 0:
		return 0, fault.New(fault.InvalidArgument, expiryHint, "expiry %s is not in the future", s)
	case d > MaxExpiry:
		return 0, fault.New(fault.InvalidArgument, expiryHint, "expiry %s is more than 10 years away", s)
	case d < MinExpiry:
		return 0, fault.New(fault.InvalidArgument, expiryHint, "expiry %s is shorter than a minute", s)
	}
	return d, nil
}

// Spec is what a new token should be.
type Spec struct {
	Tenant string
	Name   string
	Scopes []string      // empty: DefaultScopes
	TTL    time.Duration // how long it lives from now; 0: it never expires
}

// Validate checks spec and returns it with its scopes in canonical form (DefaultScopes when empty, lower-case,
// each once). Faults: INVALID_IDENTITY for a bad tenant, INVALID_ARGUMENT for a bad name, scope or lifetime.
func (spec Spec) Validate() (Spec, error) {
	if err := identity.ValidatePart("tenant", spec.Tenant); err != nil {
		return spec, err
	}
	if spec.Name == "" || len(spec.Name) > MaxNameLen || strings.ContainsFunc(spec.Name, isControl) {
		return spec, fault.New(fault.InvalidArgument,
			"name the token after what uses it, e.g. --name ci: at most 128 bytes, no control characters",
			"token name %q is empty, too long or has control characters", spec.Name)
	}
	scopes, err := ParseScopes(strings.Join(spec.Scopes, ","))
	if err != nil {
		return spec, err
	}
	spec.Scopes = scopes
	if spec.TTL != 0 && (spec.TTL < MinExpiry || spec.TTL > MaxExpiry) {
		return spec, fault.New(fault.InvalidArgument, expiryHint, "token lifetime %v is out of range", spec.TTL)
	}
	return spec, nil
}

// Create makes a token for spec, records it in ts (only its hash), and returns the record and the secret token,
// which exists nowhere else: the caller shows it once. Faults: those of Validate; INVALID_ARGUMENT for a name a
// live token of the tenant already has; STORE_UNAVAILABLE when the store fails.
func Create(ctx context.Context, ts store.TokenStore, spec Spec, now time.Time) (store.Token, string, error) {
	spec, err := spec.Validate()
	if err != nil {
		return store.Token{}, "", err
	}
	secret := Generate()
	t := store.Token{
		ID: NewID(), Tenant: spec.Tenant, Name: spec.Name, Scopes: spec.Scopes, Hash: Hash(secret), CreatedAt: now,
	}
	if spec.TTL != 0 {
		t.ExpiresAt = now.Add(spec.TTL)
	}
	t, err = store.PrepareToken(t) // the times as the store will keep them
	if err != nil {
		return store.Token{}, "", fault.Wrap(err, fault.Internal, "report this bug", "new token: %v", err)
	}
	if err := ts.CreateToken(ctx, t); err != nil {
		switch {
		case errors.Is(err, errdefs.ErrAlreadyExists):
			return store.Token{}, "", fault.Wrap(err, fault.InvalidArgument,
				fmt.Sprintf("revoke the old one first (sandkeep token list --tenant %s shows its id), or choose another --name", spec.Tenant),
				"tenant %q already has a live token named %q", spec.Tenant, spec.Name)
		case errors.Is(err, errdefs.ErrInvalidArgument):
			return store.Token{}, "", fault.Wrap(err, fault.InvalidArgument, "check the tenant, name and scopes", "%v", err)
		}
		return store.Token{}, "", storeFault(err, "cannot record the token")
	}
	return t, secret, nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) }

// Status returns t's status at now: revoked (whatever its expiry), expired, or live.
func Status(t store.Token, now time.Time) string {
	switch {
	case !t.RevokedAt.IsZero():
		return StatusRevoked
	case !t.ExpiresAt.IsZero() && !now.Before(t.ExpiresAt):
		return StatusExpired
	}
	return StatusLive
}

// Allows reports whether t carries scope, directly or through admin. An empty scope is never allowed.
func Allows(t store.Token, scope string) bool {
	if scope == "" {
		return false
	}
	return slices.Contains(t.Scopes, scope) || slices.Contains(t.Scopes, ScopeAdmin)
}

// unauthenticated is the one answer for every refused token: no reason in it, so a caller cannot tell a
// revoked token from an unknown one (or probe which tokens exist).
func unauthenticated() error {
	return fault.New(fault.Unauthenticated,
		"send 'Authorization: Bearer <token>' with a live token; an operator creates one with 'sandkeep token create --tenant T --name N'",
		"missing or invalid token")
}

// Lookup is the part of a store.TokenStore that Verify calls; every store.TokenStore is one.
type Lookup interface {
	TokenByHash(ctx context.Context, hash string) (store.Token, error)
}

var _ Lookup = store.TokenStore(nil)

// Verify checks the Authorization header of a request at now and returns its live token. A missing,
// malformed, unknown, revoked or expired token is the same UNAUTHENTICATED fault (message "missing or invalid
// token"); a store that fails is STORE_UNAVAILABLE, so an outage is not reported as a bad token.
func Verify(ctx context.Context, ts Lookup, header string, now time.Time) (store.Token, error) {
	tok, ok := bearer(header)
	if !ok {
		return store.Token{}, unauthenticated()
	}
	t, err := ts.TokenByHash(ctx, Hash(tok))
	if errors.Is(err, errdefs.ErrNotFound) {
		return store.Token{}, unauthenticated()
	}
	if err != nil {
		return store.Token{}, storeFault(err, "cannot check the token")
	}
	if Status(t, now) != StatusLive {
		return store.Token{}, unauthenticated()
	}
	return t, nil
}

// bearer returns the token of an Authorization header "Bearer <token>": the scheme in any case, spaces or tabs
// around and between the two parts tolerated, and the token well-formed.
func bearer(header string) (string, bool) {
	h := strings.Trim(header, " \t")
	i := strings.IndexAny(h, " \t")
	if i < 0 || !strings.EqualFold(h[:i], "Bearer") {
		return "", false
	}
	tok := strings.TrimLeft(h[i:], " \t")
	if !wellFormed(tok) {
		return "", false
	}
	return tok, true
}

func storeFault(err error, what string) error {
	return fault.Wrap(err, fault.StoreUnavailable, "check that the store (SQLite file or PostgreSQL) is reachable and retry",
		"%s: %v", what, err)
}
