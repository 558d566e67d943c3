package identity

import (
	"encoding/binary"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
	"pgregory.net/rapid"
)

var (
	hexKey        = regexp.MustCompile(`^[0-9a-f]{64}$`)
	containerName = regexp.MustCompile(`^sandkeep-u-[0-9a-f]{24}$`)
)

// pair is one (tenant, user).
type pair struct{ tenant, user string }

// frame is the framing Hash uses for one field; tests use it to forge inputs that try to smuggle a field
// boundary inside a part.
func frame(s string) string {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(s)))
	return string(n[:]) + s
}

func TestHashFramingCases(t *testing.T) {
	tests := []struct {
		name string
		a, b pair
	}{
		{"colon moves left", pair{"a", "b:c"}, pair{"a:b", "c"}},
		{"suffix into empty user", pair{"ab", ""}, pair{"a", "b"}},
		{"all into user", pair{"ab", ""}, pair{"", "ab"}},
		{"swap", pair{"a", "b"}, pair{"b", "a"}},
		{"slash join", pair{"a/b", "c"}, pair{"a", "b/c"}},
		{"nul join", pair{"a\x00", "b"}, pair{"a", "\x00b"}},
		{"forged user frame", pair{"t" + frame("user") + frame("u"), ""}, pair{"t", "u"}},
		{"forged tenant frame", pair{"", frame("x")}, pair{frame("x"), ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if Hash(tt.a.tenant, tt.a.user) == Hash(tt.b.tenant, tt.b.user) {
				t.Fatalf("Hash%q == Hash%q", tt.a, tt.b)
			}
		})
	}
}

// partGen draws strings built to collide under naive joining: short alphabets heavy in separators, the
// framing's own bytes, and arbitrary strings.
func partGen() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.StringMatching(`[ab:/|\x00]{0,6}`),
		rapid.SampledFrom([]string{"", ":", "tenant", "user", frame("user"), frame("")}),
		rapid.String(),
	)
}

// pairGen draws pairs, half of them by cutting one string at a random point, so that many distinct pairs
// share a concatenation ("ab","" vs "a","b").
func pairGen() *rapid.Generator[pair] {
	cut := rapid.Custom(func(t *rapid.T) pair {
		s := partGen().Draw(t, "s") + partGen().Draw(t, "s2")
		i := rapid.IntRange(0, len(s)).Draw(t, "i")
		return pair{s[:i], s[i:]}
	})
	free := rapid.Custom(func(t *rapid.T) pair {
		return pair{partGen().Draw(t, "tenant"), partGen().Draw(t, "user")}
	})
	return rapid.OneOf(cut, free)
}

func TestHashInjective(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := pairGen().Draw(t, "a"), pairGen().Draw(t, "b")
		if a == b {
			t.Skip("same pair")
		}
		if Hash(a.tenant, a.user) == Hash(b.tenant, b.user) {
			t.Fatalf("Hash%q == Hash%q", a, b)
		}
	})
}

func TestHashShiftedSuffix(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tenant := partGen().Draw(t, "tenant")
		user := partGen().Draw(t, "user")
		n := rapid.IntRange(1, max(1, len(tenant))).Draw(t, "n")
		if n > len(tenant) {
			t.Skip("tenant too short to shift")
		}
		shifted := pair{tenant[:len(tenant)-n], tenant[len(tenant)-n:] + user}
		if Hash(tenant, user) == Hash(shifted.tenant, shifted.user) {
			t.Fatalf("Hash(%q,%q) == Hash%q", tenant, user, shifted)
		}
	})
}

func TestHashDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := pairGen().Draw(t, "p")
		h := Hash(p.tenant, p.user)
		if again := Hash(strings.Clone(p.tenant), strings.Clone(p.user)); again != h {
			t.Fatalf("Hash%q not deterministic: %x vs %x", p, h, again)
		}
	})
}

func TestValidatePart(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"ascii", "acme", true},
		{"one byte", "a", true},
		{"colon and slash", "org:team/alice", true},
		{"space", "Alice Smith", true},
		{"unicode", "ünïcødé-用户-🙂", true},
		{"nbsp", "a\u00a0b", true},
		{"256 bytes", strings.Repeat("x", 256), true},
		{"256 bytes multibyte", strings.Repeat("é", 128), true},
		{"empty", "", false},
		{"257 bytes", strings.Repeat("x", 257), false},
		{"257 bytes multibyte", strings.Repeat("é", 128) + "x", false},
		{"nul", "a\x00b", false},
		{"tab", "a\tb", false},
		{"newline", "a\n", false},
		{"escape", "\x1b[31m", false},
		{"del", "a\x7f", false},
		{"c1 nel", "a\u0085", false},
		{"c1 first", "\u0080", false},
		{"c1 last", "\u009f", false},
		{"invalid utf8", "a\xffb", false},
		{"truncated utf8", "\xc3", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.in, "user")
			_, errUser := New("tenant", tt.in)
			if tt.ok {
				if err != nil || errUser != nil {
					t.Fatalf("New with %q = %v, %v; want nil", tt.in, err, errUser)
				}
				return
			}
			for _, e := range []error{err, errUser} {
				if code := fault.CodeOf(e); code != fault.InvalidIdentity {
					t.Fatalf("New with %q: code %q (%v), want %s", tt.in, code, e, fault.InvalidIdentity)
				}
			}
			if !strings.Contains(err.Error(), "tenant") || !strings.Contains(errUser.Error(), "user") {
				t.Errorf("errors do not name the part: %v / %v", err, errUser)
			}
		})
	}
}

func TestKeyNames(t *testing.T) {
	k, err := New("acme", "alice")
	if err != nil {
		t.Fatal(err)
	}
	sum := Hash("acme", "alice")
	switch {
	case k.Hex() != hex.EncodeToString(sum[:]):
		t.Errorf("Hex = %s, want the hex of Hash", k.Hex())
	case !hexKey.MatchString(k.Hex()):
		t.Errorf("Hex = %q, want 64 hex digits", k.Hex())
	case !containerName.MatchString(k.ContainerName()):
		t.Errorf("ContainerName = %q, want sandkeep-u-<24 hex>", k.ContainerName())
	case k.ContainerName() != ContainerPrefix+k.Hex()[:24] || k.Short() != k.Hex()[:24]:
		t.Errorf("ContainerName %q / Short %q are not the key's prefix", k.ContainerName(), k.Short())
	case k.IsZero() || !(Key{}).IsZero():
		t.Errorf("IsZero wrong: made %v, zero %v", k.IsZero(), (Key{}).IsZero())
	case !strings.Contains(k.String(), "acme/alice") || !strings.Contains(k.String(), k.Short()):
		t.Errorf("String = %q", k.String())
	}
}

// FuzzNew checks that New never panics, refuses only with INVALID_IDENTITY, and that an accepted key has a
// 64-hex Hex, a well-formed container name, and the hash of its own parts.
func FuzzNew(f *testing.F) {
	for _, p := range []pair{{"acme", "alice"}, {"a", "b:c"}, {"a:b", "c"}, {"", "x"}, {"x", "\x7f"}, {"t", "\u0085"}, {"\xff", "u"}} {
		f.Add(p.tenant, p.user)
	}
	f.Fuzz(func(t *testing.T, tenant, user string) {
		k, err := New(tenant, user)
		if err != nil {
			if !fault.Is(err, fault.InvalidIdentity) {
				t.Fatalf("New(%q, %q) error %v is not INVALID_IDENTITY", tenant, user, err)
			}
			return
		}
		if !hexKey.MatchString(k.Hex()) || !containerName.MatchString(k.ContainerName()) {
			t.Fatalf("New(%q, %q): Hex %q, ContainerName %q", tenant, user, k.Hex(), k.ContainerName())
		}
		if k.Tenant != tenant || k.User != user || k.IsZero() {
			t.Fatalf("New(%q, %q) = %+v", tenant, user, k)
		}
		if sum := Hash(tenant, user); k.Hex() != hex.EncodeToString(sum[:]) {
			t.Fatalf("New(%q, %q).Hex is not Hash", tenant, user)
		}
	})
}

// TestLiteralKeyHash: a Key written as a literal (the library's public alias allows it) names the sandbox New's
// key names, not one all-zero name every literal key would share.
func TestLiteralKeyHash(t *testing.T) {
	made, err := New("acme", "alice")
	if err != nil {
		t.Fatal(err)
	}
	alice, bob := Key{Tenant: "acme", User: "alice"}, Key{Tenant: "acme", User: "bob"}
	if alice.Hex() != made.Hex() || alice.ContainerName() != made.ContainerName() {
		t.Fatalf("literal %s, made %s", alice.ContainerName(), made.ContainerName())
	}
	if alice.Hex() == bob.Hex() {
		t.Fatalf("two literal keys share %s", alice.ContainerName())
	}
	// Equal as values too: a map keyed by Key (the gates, the process tables) finds one entry for both.
	if alice != made {
		t.Fatalf("literal %#v != made %#v", alice, made)
	}
	if err := (Key{Tenant: "acme"}).Check(); err == nil {
		t.Fatal("a literal key without a user passed Check")
	}
}
