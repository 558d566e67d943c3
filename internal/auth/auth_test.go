package auth

import (
	"context"
	"encoding/base64"
	"errors"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openStore(t *testing.T) store.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "tokens.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

var tokenRe = regexp.MustCompile(`^skt_[A-Za-z0-9_-]{43}$`)

func TestGenerate(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		tok := Generate()
		if !tokenRe.MatchString(tok) {
			t.Fatalf("Generate() = %q, want skt_ and 43 base64url characters", tok)
		}
		raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(tok, Prefix))
		if err != nil || len(raw) != 32 {
			t.Fatalf("Generate() = %q: decodes to %d bytes (%v), want 32", tok, len(raw), err)
		}
		if !wellFormed(tok) {
			t.Fatalf("wellFormed(%q) = false for a generated token", tok)
		}
		if seen[tok] {
			t.Fatalf("Generate() returned %q twice", tok)
		}
		seen[tok] = true
	}
}

func TestHashAndID(t *testing.T) {
	// SHA-256 test vector (FIPS 180-2, "abc").
	if got, want := Hash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Errorf("Hash(abc) = %s, want %s", got, want)
	}
	a, b := Generate(), Generate()
	if Hash(a) == Hash(b) || Hash(a) != Hash(a) {
		t.Error("Hash is not a function of the token alone")
	}
	ids := map[string]bool{}
	for range 200 {
		id := NewID()
		if !regexp.MustCompile(`^tok_[0-9a-f]{16}$`).MatchString(id) || !store.ValidTokenID(id) {
			t.Fatalf("NewID() = %q, want tok_ and 16 lower-case hex digits", id)
		}
		if ids[id] {
			t.Fatalf("NewID() returned %q twice", id)
		}
		ids[id] = true
	}
}

func TestParseScopes(t *testing.T) {
	tests := []struct {
		in   string
		want []string // nil: an INVALID_ARGUMENT fault
	}{
		{"", []string{"exec", "files", "read"}},
		{"  ", []string{"exec", "files", "read"}},
		{"exec", []string{"exec"}},
		{"exec,files", []string{"exec", "files"}},
		{"read, exec", []string{"read", "exec"}},
		{"ADMIN", []string{"admin"}},
		{"exec,exec,read,exec", []string{"exec", "read"}},
		{"exec,files,read,admin", []string{"exec", "files", "read", "admin"}},
		{"root", nil},
		{"exec,", nil},
		{",exec", nil},
		{"exec,,read", nil},
		{"exec;read", nil},
		{"exec read", nil},
		{"*", nil},
	}
	for _, tt := range tests {
		got, err := ParseScopes(tt.in)
		if tt.want == nil {
			if !fault.Is(err, fault.InvalidArgument) || !strings.Contains(err.Error(), "exec, files, read, admin") {
				t.Errorf("ParseScopes(%q) = %q, %v; want INVALID_ARGUMENT naming the scopes", tt.in, got, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseScopes(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	d := DefaultScopes()
	d[0] = "admin"
	if DefaultScopes()[0] != ScopeExec {
		t.Error("DefaultScopes returns a shared slice")
	}
}

func TestParseExpiry(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"", 0, false},
		{"never", 0, false},
		{" Never ", 0, false},
		{"30d", 30 * day, false},
		{"1d", day, false},
		{"12h", 12 * time.Hour, false},
		{"90m", 90 * time.Minute, false},
		{"1h30m", 90 * time.Minute, false},
		{"1m", time.Minute, false},
		{"3650d", 3650 * day, false},
		{"87600h", 3650 * day, false},
		{"3651d", 0, true},
		{"87601h", 0, true},
		{"99999999999999999999d", 0, true},
		{"2562048h", 0, true}, // past what a Duration holds
		{"30s", 0, true},
		{"59s", 0, true},
		{"0d", 0, true},
		{"0", 0, true},
		{"-1h", 0, true},
		{"-1d", 0, true},
		{"+1d", 0, true},
		{"1.5d", 0, true},
		{"1d12h", 0, true},
		{"d", 0, true},
		{"30", 0, true},
		{"30D", 0, true},
		{"forever", 0, true},
		{"1w", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseExpiry(tt.in)
		if tt.wantErr {
			if !fault.Is(err, fault.InvalidArgument) {
				t.Errorf("ParseExpiry(%q) = %v, %v; want INVALID_ARGUMENT", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseExpiry(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestAllowsAndStatus(t *testing.T) {
	tok := func(scopes ...string) store.Token { return store.Token{Scopes: scopes} }
	tests := []struct {
		tok   store.Token
		scope string
		want  bool
	}{
		{tok("exec"), "exec", true},
		{tok("exec"), "files", false},
		{tok("exec"), "admin", false},
		{tok("read", "files"), "files", true},
		{tok("admin"), "exec", true},
		{tok("admin"), "files", true},
		{tok("admin"), "read", true},
		{tok("admin"), "admin", true},
		{tok("admin"), "", false},
		{tok(), "read", false},
		{tok("exec"), "EXEC", false},
	}
	for _, tt := range tests {
		if got := Allows(tt.tok, tt.scope); got != tt.want {
			t.Errorf("Allows(%q, %q) = %v, want %v", tt.tok.Scopes, tt.scope, got, tt.want)
		}
	}

	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name             string
		expires, revoked time.Time
		want             string
	}{
		{"never expires", time.Time{}, time.Time{}, StatusLive},
		{"expires later", now.Add(time.Millisecond), time.Time{}, StatusLive},
		{"expires now", now, time.Time{}, StatusExpired},
		{"expired", now.Add(-time.Hour), time.Time{}, StatusExpired},
		{"revoked", time.Time{}, now.Add(-time.Hour), StatusRevoked},
		{"revoked and expired", now.Add(-time.Hour), now.Add(-2 * time.Hour), StatusRevoked},
	} {
		if got := Status(store.Token{ExpiresAt: tt.expires, RevokedAt: tt.revoked}, now); got != tt.want {
			t.Errorf("%s: Status = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestCreate(t *testing.T) {
	ctx := t.Context()
	s := openStore(t)
	now := time.Date(2025, 6, 1, 12, 0, 0, 123_456_789, time.FixedZone("X", 7200))

	tok, secret, err := Create(ctx, s, Spec{Tenant: "acme", Name: "ci", TTL: 30 * 24 * time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	if !tokenRe.MatchString(secret) || tok.Hash != Hash(secret) || !store.ValidTokenID(tok.ID) {
		t.Fatalf("Create: token %+v, secret %q", tok, secret)
	}
	wantCreated := now.UTC().Truncate(time.Millisecond)
	if !tok.CreatedAt.Equal(wantCreated) || !tok.ExpiresAt.Equal(now.Add(30*24*time.Hour).UTC().Truncate(time.Millisecond)) ||
		tok.ExpiresAt.Location() != time.UTC {
		t.Errorf("Create: CreatedAt %v, ExpiresAt %v; want %v and 30 days later, UTC ms", tok.CreatedAt, tok.ExpiresAt, wantCreated)
	}
	if !slices.Equal(tok.Scopes, DefaultScopes()) {
		t.Errorf("Create without scopes: %q, want the defaults", tok.Scopes)
	}
	stored, err := s.TokenByHash(ctx, Hash(secret))
	if err != nil || !reflect.DeepEqual(stored, tok) {
		t.Errorf("stored token %+v (%v), want what Create returned %+v", stored, err, tok)
	}

	for _, tt := range []struct {
		name string
		spec Spec
		code fault.Code
	}{
		{"same live name", Spec{Tenant: "acme", Name: "ci"}, fault.InvalidArgument},
		{"empty tenant", Spec{Tenant: "", Name: "x"}, fault.InvalidIdentity},
		{"control tenant", Spec{Tenant: "a\nb", Name: "x"}, fault.InvalidIdentity},
		{"empty name", Spec{Tenant: "acme", Name: ""}, fault.InvalidArgument},
		{"control name", Spec{Tenant: "acme", Name: "c\x00i"}, fault.InvalidArgument},
		{"long name", Spec{Tenant: "acme", Name: strings.Repeat("n", MaxNameLen+1)}, fault.InvalidArgument},
		{"unknown scope", Spec{Tenant: "acme", Name: "x", Scopes: []string{"exec", "sudo"}}, fault.InvalidArgument},
		{"short life", Spec{Tenant: "acme", Name: "x", TTL: time.Second}, fault.InvalidArgument},
		{"negative life", Spec{Tenant: "acme", Name: "x", TTL: -time.Hour}, fault.InvalidArgument},
		{"long life", Spec{Tenant: "acme", Name: "x", TTL: MaxExpiry + time.Hour}, fault.InvalidArgument},
	} {
		if _, secret, err := Create(ctx, s, tt.spec, now); !fault.Is(err, tt.code) || secret != "" {
			t.Errorf("%s: Create = %q, %v; want %s", tt.name, secret, err, tt.code)
		}
	}
	if toks, err := s.ListTokens(ctx, ""); err != nil || len(toks) != 1 {
		t.Errorf("after refused creates: %d tokens (%v), want 1", len(toks), err)
	}

	// Same name in another tenant, and again once the first is revoked.
	if _, _, err := Create(ctx, s, Spec{Tenant: "beta", Name: "ci", Scopes: []string{"admin"}}, now); err != nil {
		t.Errorf("same name in another tenant: %v", err)
	}
	if err := s.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Create(ctx, s, Spec{Tenant: "acme", Name: "ci"}, now); err != nil {
		t.Errorf("name of a revoked token: %v", err)
	}
}

// failingStore is a Lookup that fails as an unreachable database would.
type failingStore struct{}

var errDown = errors.New("connection refused")

func (failingStore) TokenByHash(context.Context, string) (store.Token, error) {
	return store.Token{}, errDown
}

func TestVerify(t *testing.T) {
	ctx := t.Context()
	s := openStore(t)
	now := time.Now()
	live, liveSecret, err := Create(ctx, s, Spec{Tenant: "acme", Name: "live", Scopes: []string{"read"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	_, expSecret, err := Create(ctx, s, Spec{Tenant: "acme", Name: "short", TTL: time.Hour}, now.Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	revoked, revSecret, err := Create(ctx, s, Spec{Tenant: "acme", Name: "gone"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeToken(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}

	for _, h := range []string{
		"Bearer " + liveSecret,
		"bearer " + liveSecret,
		"BEARER " + liveSecret,
		"  Bearer \t  " + liveSecret + " \t",
	} {
		got, err := Verify(ctx, s, h, now)
		if err != nil || !reflect.DeepEqual(got, live) {
			t.Errorf("Verify(%q) = %+v, %v; want the live token", h, got, err)
		}
	}

	want := unauthenticated()
	for _, tt := range []struct{ name, header string }{
		{"missing", ""},
		{"blank", "   "},
		{"scheme only", "Bearer"},
		{"scheme and space", "Bearer "},
		{"token without scheme", liveSecret},
		{"basic", "Basic " + liveSecret},
		{"bearer glued", "Bearer" + liveSecret},
		{"two tokens", "Bearer " + liveSecret + " " + liveSecret},
		{"truncated", "Bearer " + liveSecret[:len(liveSecret)-1]},
		{"extended", "Bearer " + liveSecret + "A"},
		{"wrong prefix", "Bearer skx_" + liveSecret[4:]},
		{"bad character", "Bearer " + liveSecret[:10] + "+" + liveSecret[11:]},
		{"newline inside", "Bearer " + liveSecret[:10] + "\n" + liveSecret[11:]},
		{"unknown", "Bearer " + Generate()},
		{"hash instead of token", "Bearer " + live.Hash},
		{"expired", "Bearer " + expSecret},
		{"revoked", "Bearer " + revSecret},
	} {
		got, err := Verify(ctx, s, tt.header, now)
		if !reflect.DeepEqual(err, want) || !reflect.DeepEqual(got, store.Token{}) {
			t.Errorf("%s: Verify = %+v, %#v; want exactly %#v", tt.name, got, err, want)
		}
	}
	fe := want.(*fault.Error)
	if fe.Code != fault.Unauthenticated || fe.Message != "missing or invalid token" || !strings.Contains(fe.Hint, "sandkeep token create") {
		t.Errorf("refusal %+v: want UNAUTHENTICATED, the fixed message, a hint naming 'sandkeep token create'", fe)
	}

	// Expiry is judged at the now given: the same token was live before it expired.
	if _, err := Verify(ctx, s, "Bearer "+expSecret, now.Add(-90*time.Minute)); err != nil {
		t.Errorf("token before its expiry: %v", err)
	}
	// Revocation takes effect on the next verification.
	if err := s.RevokeToken(ctx, live.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(ctx, s, "Bearer "+liveSecret, now); !reflect.DeepEqual(err, want) {
		t.Errorf("after revoke: Verify = %v, want %v", err, want)
	}

	// A store outage is not a bad token.
	_, err = Verify(ctx, failingStore{}, "Bearer "+liveSecret, now)
	if !fault.Is(err, fault.StoreUnavailable) || !errors.Is(err, errDown) {
		t.Errorf("store down: Verify = %v, want STORE_UNAVAILABLE wrapping the cause", err)
	}
	// A malformed header never reaches the store.
	if _, err := Verify(ctx, failingStore{}, "Bearer nonsense", now); !reflect.DeepEqual(err, want) {
		t.Errorf("malformed header with the store down: %v, want %v", err, want)
	}
}
