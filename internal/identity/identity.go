// Package identity turns a (tenant, user) pair into a Key: the SHA-256 of a length-prefixed framing of both
// parts, so that no two distinct pairs can share a key. The key names everything a sandbox owns.
package identity

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// MaxPartLen is the longest tenant or user accepted, in bytes.
const MaxPartLen = 256

// ContainerPrefix starts the name of every sandbox container.
const ContainerPrefix = "sandkeep-u-"

// Key identifies one sandbox: the hash of its (tenant, user). The zero Key is invalid. The hash is derived from
// the two fields, never stored: a Key written as a literal (Key{Tenant: t, User: u}, which the library's public
// alias allows) is equal to New's, names the same sandbox and finds the same gate in a map.
type Key struct {
	Tenant string
	User   string
}

// New validates tenant and user and returns their Key.
func New(tenant, user string) (Key, error) {
	k := Key{Tenant: tenant, User: user}
	if err := k.Check(); err != nil {
		return Key{}, err
	}
	return k, nil
}

// Check validates a key's parts as New does; admission calls it for keys that did not come from New.
func (k Key) Check() error {
	if err := ValidatePart("tenant", k.Tenant); err != nil {
		return err
	}
	return ValidatePart("user", k.User)
}

// Hash is the SHA-256 over the framing ("tenant", t), ("user", u), each field as an 8-byte big-endian length
// followed by its bytes. Length prefixes make the framing injective: "a","b:c" and "a:b","c" differ.
func Hash(tenant, user string) [sha256.Size]byte {
	h := sha256.New()
	for _, f := range []string{"tenant", tenant, "user", user} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// ValidatePart checks one part (named what) of an identity.
func ValidatePart(what, s string) error {
	const hint = "use a non-empty name of at most 256 bytes with no control characters"
	switch {
	case s == "":
		return fault.New(fault.InvalidIdentity, hint, "%s is empty", what)
	case len(s) > MaxPartLen:
		return fault.New(fault.InvalidIdentity, hint, "%s is %d bytes long, over the limit of %d", what, len(s), MaxPartLen)
	case !utf8.ValidString(s):
		return fault.New(fault.InvalidIdentity, hint, "%s is not valid UTF-8", what)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fault.New(fault.InvalidIdentity, hint, "%s %q contains a control character", what, s)
		}
	}
	return nil
}

// PoolPrefix starts the name of a warm pool's member that no key has claimed yet.
const PoolPrefix = "sandkeep-p-"

// Member is the key of a warm pool member of template, id its random name. Its tenant is empty, which New never
// accepts, so no caller's (tenant, user) can ever hash to a member's key. A member's key names its workspace,
// channel directory and uid until a key claims it, and then keeps naming them for that key (the claim record).
func Member(template, id string) Key {
	user := "pool/" + template + "/" + id
	return Key{User: user}
}

// MemberName is the container name of the unclaimed pool member k.
func (k Key) MemberName() string { return PoolPrefix + k.Short() }

// IsZero reports whether k is the zero Key (neither part set).
func (k Key) IsZero() bool { return k == Key{} }

// Hex is the full key, 64 hex digits; it names the workspace directory and the lock file.
func (k Key) Hex() string {
	sum := Hash(k.Tenant, k.User)
	return hex.EncodeToString(sum[:])
}

// Short is the first 24 hex digits of the key, used in the container name and in messages.
func (k Key) Short() string { return k.Hex()[:24] }

// ContainerName is the name of the key's sandbox container.
func (k Key) ContainerName() string { return ContainerPrefix + k.Short() }

// String is for logs and errors: tenant/user and the short key.
func (k Key) String() string { return k.Tenant + "/" + k.User + " (" + k.Short() + ")" }
