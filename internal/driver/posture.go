package driver

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// Paths inside every sandbox.
const (
	WorkspaceDir = "/workspace"
	AgentDir     = "/.sandkeep"                 // the agent's read-only directory
	AgentPath    = AgentDir + "/sandkeep-agent" // the agent binary; PID 1 runs it as "init"
	HomeDir      = "/home/sandbox"
)

// Posture is the security-relevant shape of a sandbox. It is built in one place (lifecycle), hashed with Hash,
// and applied field by field by the driver: a change of any field changes the hash and recycles the sandbox.
type Posture struct {
	User            string   `json:"user"` // "uid:gid"
	ReadOnlyRoot    bool     `json:"read_only_root"`
	CapDrop         []string `json:"cap_drop"`
	NoNewPrivileges bool     `json:"no_new_privileges"`
	PidsLimit       int64    `json:"pids_limit"`
	MemoryBytes     int64    `json:"memory_bytes"`
	MemorySwapBytes int64    `json:"memory_swap_bytes"` // memory + swap; equal to MemoryBytes means no swap
	NanoCPUs        int64    `json:"nano_cpus"`
	// RequestNanoCPUs and RequestMemoryBytes are what the sandbox asks the scheduler to set aside, apart from
	// what it may use (NanoCPUs, MemoryBytes); zero is "as much as the limit". Kubernetes makes them the pod's
	// requests (a Burstable pod); Docker, which schedules nothing, its CPU weight and memory reservation.
	RequestNanoCPUs    int64             `json:"request_nano_cpus,omitempty"`
	RequestMemoryBytes int64             `json:"request_memory_bytes,omitempty"`
	Tmpfs              map[string]string `json:"tmpfs"` // target -> mount options
	Env                []string          `json:"env"`   // "K=V", the sandbox's base environment
	Network            string            `json:"network"`
	Mounts             []Mount           `json:"mounts"`
	LogMaxSize         string            `json:"log_max_size"`
	LogMaxFiles        string            `json:"log_max_files"`
	Init               []string          `json:"init"` // PID 1: the agent in init mode, which reaps zombies
	// Seccomp is the seccomp profile, compact JSON (SeccompProfile); "" leaves the engine's default.
	Seccomp string   `json:"seccomp"`
	Ulimits []Ulimit `json:"ulimits"`
	// StopSignal is what the engine sends PID 1 to stop the sandbox. The agent's init ignores every signal its
	// commands can send it, so the host stops with SIGKILL, which only the host can deliver to a namespace's init.
	StopSignal string `json:"stop_signal"`
	// Runtime is the engine's OCI runtime ("" the engine's default, "runsc" for gVisor).
	Runtime string `json:"runtime,omitempty"`
	// WorkspaceBytes and WorkspaceInodes are the workspace's quota (its own file system, which the lifecycle
	// mounts before the driver binds it); zero is none. The driver applies nothing for them: they are here so a
	// change recycles the sandbox.
	WorkspaceBytes  int64 `json:"workspace_bytes,omitempty"`
	WorkspaceInodes int64 `json:"workspace_inodes,omitempty"`
	// Companions is the hash of the compose companions' definitions (image, environment, command, volumes,
	// healthcheck, depends_on), "" for none: the driver applies nothing for it; a changed service recycles the
	// sandbox, and its companions with it, as a changed image does.
	Companions string `json:"companions,omitempty"`
}

// Ulimit is one resource limit (setrlimit) of every process in the sandbox; Soft <= Hard, and a process can
// never raise Hard.
type Ulimit struct {
	Name string `json:"name"` // "core", "nofile", as Docker names them
	Soft int64  `json:"soft"`
	Hard int64  `json:"hard"`
}

// Mount is one host path bound into a sandbox.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only"`
}

// Hash is the hex SHA-256 of the posture's canonical JSON (encoding/json sorts map keys).
func (p Posture) Hash() string {
	b, err := json.Marshal(p)
	if err != nil {
		panic("posture is always marshalable: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
