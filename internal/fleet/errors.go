package fleet

import "github.com/sandkeep/sandkeep/internal/fault"

// ErrDraining is Claim's error on a replica that is shutting down: it takes no new key.
var ErrDraining = fault.New(fault.ShuttingDown, "retry on another replica: it takes the key over",
	"this replica is shutting down and takes no new key")
