package storetest

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/store"
)

// newToken returns a valid live token of tenant named name, with a fresh id and hash, created at a fixed time.
func newToken(t *testing.T, tenant, name string) store.Token {
	t.Helper()
	var id [8]byte
	var secret [32]byte
	_, _ = rand.Read(id[:])
	_, _ = rand.Read(secret[:])
	sum := sha256.Sum256(secret[:])
	return store.Token{
		ID:        store.TokenIDPrefix + hex.EncodeToString(id[:]),
		Tenant:    tenant,
		Name:      name,
		Scopes:    []string{store.ScopeExec, store.ScopeFiles, store.ScopeRead},
		Hash:      hex.EncodeToString(sum[:]),
		CreatedAt: time.Date(2025, 3, 4, 5, 6, 7, 891_000_000, time.UTC),
	}
}

func mustCreateToken(t *testing.T, s store.Store, tok store.Token) {
	t.Helper()
	if err := s.CreateToken(ctxOf(t), tok); err != nil {
		t.Fatalf("CreateToken(%s): %v", tok.ID, err)
	}
}

func mustTokenByHash(t *testing.T, s store.Store, hash string) store.Token {
	t.Helper()
	tok, err := s.TokenByHash(ctxOf(t), hash)
	if err != nil {
		t.Fatalf("TokenByHash: %v", err)
	}
	return tok
}

func mustListTokens(t *testing.T, s store.Store, tenant string) []store.Token {
	t.Helper()
	toks, err := s.ListTokens(ctxOf(t), tenant)
	if err != nil {
		t.Fatalf("ListTokens(%q): %v", tenant, err)
	}
	return toks
}

// sameToken checks got against want: times equal and in UTC, everything else identical, scopes in order.
func sameToken(t *testing.T, got, want store.Token) {
	t.Helper()
	for _, tm := range []struct {
		what      string
		got, want time.Time
	}{
		{"CreatedAt", got.CreatedAt, want.CreatedAt},
		{"ExpiresAt", got.ExpiresAt, want.ExpiresAt},
		{"RevokedAt", got.RevokedAt, want.RevokedAt},
	} {
		if !tm.got.Equal(tm.want) || tm.got.IsZero() != tm.want.IsZero() || (!tm.got.IsZero() && tm.got.Location() != time.UTC) {
			t.Errorf("token %s: %s = %v, want %v (UTC)", want.ID, tm.what, tm.got, tm.want)
		}
	}
	got.CreatedAt, got.ExpiresAt, got.RevokedAt = time.Time{}, time.Time{}, time.Time{}
	want.CreatedAt, want.ExpiresAt, want.RevokedAt = time.Time{}, time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("token read back:\n got %+v\nwant %+v", got, want)
	}
}

func tokenIDs(toks []store.Token) []string {
	out := make([]string, len(toks))
	for i, tok := range toks {
		out[i] = tok.ID
	}
	return out
}

// aboutNow checks that tm is within [before, now+1s], in UTC, with millisecond precision.
func aboutNow(t *testing.T, what string, tm, before time.Time) {
	t.Helper()
	if tm.Before(before) || tm.After(time.Now().Add(time.Second)) || tm.Location() != time.UTC ||
		tm.Nanosecond()%int(time.Millisecond) != 0 {
		t.Errorf("%s = %v: want about now, UTC, whole milliseconds", what, tm)
	}
}

func testTokenLifecycle(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	tok := newToken(t, "acme", "ci")
	tok.Scopes = []string{store.ScopeRead, store.ScopeAdmin, store.ScopeExec} // not in any canonical order
	zone := time.FixedZone("X", 3600)
	tok.CreatedAt = time.Date(2025, 3, 4, 6, 6, 7, 891_234_567, zone)
	tok.ExpiresAt = time.Date(2125, 3, 4, 6, 6, 7, 999_999_999, zone)
	mustCreateToken(t, s, tok)

	want := tok
	want.CreatedAt = tok.CreatedAt.UTC().Truncate(time.Millisecond)
	want.ExpiresAt = tok.ExpiresAt.UTC().Truncate(time.Millisecond)
	sameToken(t, mustTokenByHash(t, s, tok.Hash), want)

	before := time.Now().UTC().Truncate(time.Millisecond)
	if err := s.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatalf("RevokeToken: %v", err)
	}
	got := mustTokenByHash(t, s, tok.Hash) // a revoked token is still found: the caller decides
	aboutNow(t, "RevokedAt", got.RevokedAt, before)
	want.RevokedAt = got.RevokedAt
	sameToken(t, got, want)

	// Revoking again is not an error and keeps the first revocation time.
	time.Sleep(5 * time.Millisecond)
	if err := s.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatalf("RevokeToken again: %v", err)
	}
	sameToken(t, mustTokenByHash(t, s, tok.Hash), want)
	if toks := mustListTokens(t, s, "acme"); len(toks) != 1 {
		t.Fatalf("ListTokens after revoke: %v, want the revoked token", tokenIDs(toks))
	} else {
		sameToken(t, toks[0], want)
	}
}

func testTokenDefaults(t *testing.T, s store.Store) {
	tok := newToken(t, "acme", "ci")
	tok.CreatedAt = time.Time{}
	scopes := tok.Scopes
	before := time.Now().UTC().Truncate(time.Millisecond)
	mustCreateToken(t, s, tok)
	scopes[0] = "mutated" // the store keeps its own copy
	got := mustTokenByHash(t, s, tok.Hash)
	aboutNow(t, "CreatedAt", got.CreatedAt, before)
	if !got.ExpiresAt.IsZero() || !got.RevokedAt.IsZero() {
		t.Errorf("ExpiresAt = %v, RevokedAt = %v: want zero (never, live)", got.ExpiresAt, got.RevokedAt)
	}
	if want := []string{store.ScopeExec, store.ScopeFiles, store.ScopeRead}; !slices.Equal(got.Scopes, want) {
		t.Errorf("Scopes = %q, want %q", got.Scopes, want)
	}
}

func testTokenExpired(t *testing.T, s store.Store) {
	tok := newToken(t, "acme", "old")
	tok.CreatedAt = time.Now().Add(-48 * time.Hour)
	tok.ExpiresAt = time.Now().Add(-24 * time.Hour)
	mustCreateToken(t, s, tok)
	got := mustTokenByHash(t, s, tok.Hash)
	want := tok
	want.CreatedAt, want.ExpiresAt = tok.CreatedAt.UTC().Truncate(time.Millisecond), tok.ExpiresAt.UTC().Truncate(time.Millisecond)
	sameToken(t, got, want)
	if !got.RevokedAt.IsZero() {
		t.Errorf("an expired token reads back revoked: %v", got.RevokedAt)
	}
}

func testTokenInvalid(t *testing.T, s store.Store) {
	tests := []struct {
		name   string
		mutate func(tok *store.Token)
	}{
		{"empty id", func(tok *store.Token) { tok.ID = "" }},
		{"id without prefix", func(tok *store.Token) { tok.ID = "0123456789abcdef" }},
		{"id too short", func(tok *store.Token) { tok.ID = "tok_0123" }},
		{"id upper-case", func(tok *store.Token) { tok.ID = "tok_0123456789ABCDEF" }},
		{"empty tenant", func(tok *store.Token) { tok.Tenant = "" }},
		{"empty name", func(tok *store.Token) { tok.Name = "" }},
		{"empty hash", func(tok *store.Token) { tok.Hash = "" }},
		{"short hash", func(tok *store.Token) { tok.Hash = tok.Hash[:63] }},
		{"hash not hex", func(tok *store.Token) { tok.Hash = "z" + tok.Hash[1:] }},
		{"hash upper-case", func(tok *store.Token) { tok.Hash = "ABCDEF" + tok.Hash[6:] }},
		{"no scopes", func(tok *store.Token) { tok.Scopes = nil }},
		{"unknown scope", func(tok *store.Token) { tok.Scopes = []string{store.ScopeExec, "root"} }},
		{"empty scope", func(tok *store.Token) { tok.Scopes = []string{""} }},
		{"scope twice", func(tok *store.Token) { tok.Scopes = []string{store.ScopeRead, store.ScopeRead} }},
		{"already revoked", func(tok *store.Token) { tok.RevokedAt = tok.CreatedAt }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok := newToken(t, "invalid-"+tt.name, "ci")
			tt.mutate(&tok)
			wantErr(t, "CreateToken", s.CreateToken(ctxOf(t), tok), errdefs.ErrInvalidArgument)
			_, err := s.TokenByHash(ctxOf(t), tok.Hash)
			wantErr(t, "TokenByHash after invalid create", err, errdefs.ErrNotFound)
		})
	}
	if toks := mustListTokens(t, s, ""); len(toks) != 0 {
		t.Errorf("ListTokens after invalid creates: %v, want none", tokenIDs(toks))
	}
}

func testTokenDuplicate(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	orig := newToken(t, "acme", "ci")
	mustCreateToken(t, s, orig)

	sameID := newToken(t, "other", "other")
	sameID.ID = orig.ID
	wantErr(t, "CreateToken with a used id", s.CreateToken(ctx, sameID), errdefs.ErrAlreadyExists)
	sameHash := newToken(t, "other", "other")
	sameHash.Hash = orig.Hash
	wantErr(t, "CreateToken with a used hash", s.CreateToken(ctx, sameHash), errdefs.ErrAlreadyExists)
	sameName := newToken(t, "acme", "ci")
	wantErr(t, "CreateToken with a live token's name", s.CreateToken(ctx, sameName), errdefs.ErrAlreadyExists)
	if toks := mustListTokens(t, s, ""); len(toks) != 1 {
		t.Fatalf("after refused duplicates: tokens %v, want only %s", tokenIDs(toks), orig.ID)
	}
	sameToken(t, mustTokenByHash(t, s, orig.Hash), orig)

	// Names are per tenant.
	mustCreateToken(t, s, newToken(t, "beta", "ci"))

	// A revoked token's name is free again, for one live token at a time; its id and hash stay taken.
	if err := s.RevokeToken(ctx, orig.ID); err != nil {
		t.Fatal(err)
	}
	mustCreateToken(t, s, sameName)
	wantErr(t, "CreateToken with the new live token's name", s.CreateToken(ctx, newToken(t, "acme", "ci")), errdefs.ErrAlreadyExists)
	wantErr(t, "CreateToken with a revoked token's hash", s.CreateToken(ctx, sameHash), errdefs.ErrAlreadyExists)
	wantErr(t, "CreateToken with a revoked token's id", s.CreateToken(ctx, sameID), errdefs.ErrAlreadyExists)
	if toks := mustListTokens(t, s, "acme"); len(toks) != 2 {
		t.Errorf("tenant acme has tokens %v, want the revoked and the new one", tokenIDs(toks))
	}
}

func testTokenNotFound(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	tok := newToken(t, "acme", "ci")
	_, err := s.TokenByHash(ctx, tok.Hash)
	wantErr(t, "TokenByHash of an unknown hash", err, errdefs.ErrNotFound)
	_, err = s.TokenByHash(ctx, "")
	wantErr(t, "TokenByHash of an empty hash", err, errdefs.ErrNotFound)
	wantErr(t, "RevokeToken of an unknown id", s.RevokeToken(ctx, tok.ID), errdefs.ErrNotFound)
	wantErr(t, "RevokeToken of an empty id", s.RevokeToken(ctx, ""), errdefs.ErrNotFound)
	if toks := mustListTokens(t, s, "nobody"); len(toks) != 0 {
		t.Errorf("ListTokens(nobody) = %v, want none", tokenIDs(toks))
	}
	if toks := mustListTokens(t, s, ""); len(toks) != 0 {
		t.Errorf("ListTokens of an empty store = %v, want none", tokenIDs(toks))
	}
}

func testListTokens(t *testing.T, s store.Store) {
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	type spec struct {
		tenant, name string
		at           time.Duration
	}
	specs := []spec{ // created in this order, at base+at
		{"t1", "a", 5 * time.Hour},
		{"t2", "a", 1 * time.Millisecond},
		{"t1", "b", 2 * time.Millisecond},
		{"t1", "c", 5 * time.Hour}, // same time as the first: creation order breaks the tie
		{"t2", "b", 3 * time.Second},
	}
	all := make([]store.Token, len(specs))
	for i, sp := range specs {
		tok := newToken(t, sp.tenant, sp.name)
		tok.CreatedAt = base.Add(sp.at)
		tok.Scopes = []string{store.ScopeAdmin}
		mustCreateToken(t, s, tok)
		all[i] = tok
	}
	if err := s.RevokeToken(ctxOf(t), all[2].ID); err != nil {
		t.Fatal(err)
	}
	pick := func(idx ...int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, all[i].ID)
		}
		return out
	}
	for _, tt := range []struct {
		tenant string
		want   []string
	}{
		{"", pick(1, 2, 4, 0, 3)},
		{"t1", pick(2, 0, 3)},
		{"t2", pick(1, 4)},
		{"t3", nil},
	} {
		got := mustListTokens(t, s, tt.tenant)
		if !slices.Equal(tokenIDs(got), tt.want) {
			t.Errorf("ListTokens(%q) = %v, want %v (oldest first)", tt.tenant, tokenIDs(got), tt.want)
		}
	}
	for _, got := range mustListTokens(t, s, "") {
		i := slices.IndexFunc(all, func(tok store.Token) bool { return tok.ID == got.ID })
		want := all[i]
		if i == 2 {
			if got.RevokedAt.IsZero() {
				t.Errorf("revoked token %s lists as live", got.ID)
			}
			want.RevokedAt = got.RevokedAt
		}
		sameToken(t, got, want)
	}
}

// testConcurrentTokenName races creations of live tokens with one (tenant, name): exactly one wins.
func testConcurrentTokenName(t *testing.T, s store.Store) {
	const n = 8
	ctx := ctxOf(t)
	results := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		tok := newToken(t, "acme", "ci")
		wg.Go(func() { results[i] = s.CreateToken(ctx, tok) })
	}
	wg.Wait()
	won := 0
	for i, err := range results {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, errdefs.ErrAlreadyExists):
			t.Errorf("create %d: %v, want success or %v", i, err, errdefs.ErrAlreadyExists)
		}
	}
	if toks := mustListTokens(t, s, "acme"); won != 1 || len(toks) != 1 {
		t.Errorf("%d creations succeeded and %d tokens exist; want exactly one", won, len(toks))
	}
}
