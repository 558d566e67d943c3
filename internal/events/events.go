// Package events names every event sandkeep records and defines its typed payload. It is the one place an event
// name is spelled: producers build an Event with New, which refuses an unknown name or a payload of the wrong
// type, and readers turn the stored JSON back into the typed payload with Decode.
//
// Payloads never carry secrets. In particular an exec is described by argv[0] only (see Command), never by its
// arguments, environment or output; secret files appear as a count or a flag, never by content; denied
// environment variables by name only.
package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"time"
)

// Event names. Never change the spelling of an existing name: stored events and operators' queries use it.
const (
	NameSandboxSkipped       = "sandbox_skipped"
	NameSandboxStarted       = "sandbox_started"
	NameSandboxAdopted       = "sandbox_adopted"
	NameSandboxClaimed       = "sandbox_claimed"
	NameSandboxForked        = "sandbox_forked"
	NameSnapshotCreated      = "snapshot_created"
	NameSnapshotRestored     = "snapshot_restored"
	NameSnapshotDeleted      = "snapshot_deleted"
	NameSandboxRecycled      = "sandbox_recycled"
	NameSandboxStoppedIdle   = "sandbox_stopped_idle"
	NameSandboxRemoved       = "sandbox_removed"
	NameSandboxBuildStarted  = "sandbox_build_started"
	NameSandboxBuildFinished = "sandbox_build_finished"
	NameSandboxBuildFailed   = "sandbox_build_failed"
	NameSandboxFeatures      = "sandbox_features_installed"
	NameSandboxEnvDenied     = "sandbox_env_denied"
	NameSandboxPostCreate    = "sandbox_post_create"
	NameDevcontainerDropped  = "sandbox_devcontainer_dropped"
	NameSandboxPostStart     = "sandbox_post_start"
	NameExecStarted          = "exec_started"
	NameExecFinished         = "exec_finished"
	NameNetworkBlocked       = "network_blocked"
	NameCredentialReflected  = "credential_reflected"
	NameNetworkBlockedRepeat = "network_blocked_repeats"
	NameNetworkUpdated       = "network_updated"
	NamePortForwardOpened    = "port_forward_opened"
	NamePortForwardClosed    = "port_forward_closed"
	NameProcessStarted       = "process_started"
	NameProcessEnded         = "process_ended"
	NameSandboxShared        = "sandbox_shared"
	NameHostBindsDropped     = "sandbox_host_binds_dropped"
	NameUserRemap            = "sandbox_user_remap"
	NameUIDMismatch          = "sandbox_uid_mismatch_warning"
	NameImageEnvPlanted      = "sandbox_image_env_planted"
	NameHostStateMounted     = "sandbox_host_state_mounted"
	NameHostServiceOpened    = "host_service_opened"
	NameHostServiceClosed    = "host_service_closed"
	NameHostServiceRefused   = "host_service_refused"
	NameHostServicesDropped  = "host_services_dropped"
	NameReaperRemoved        = "reaper_removed"
	NameReaperKept           = "reaper_kept"
	NameSandboxSuspended     = "sandbox_suspended"
	NameSandboxResumed       = "sandbox_resumed"
)

// Event is one recorded fact. Seq is assigned by the store when the event is appended (zero before); RunID is
// empty for events that belong to no run (the sweeper's, for instance). Time is UTC with millisecond precision.
type Event struct {
	Seq       int64           `json:"seq"`
	RunID     string          `json:"run_id,omitempty"`
	Time      time.Time       `json:"time"`
	Name      string          `json:"name"`
	Payload   json.RawMessage `json:"payload"`
	RequestID string          `json:"request_id,omitempty"`
}

// payloadTypes maps each event name to the type of its payload. It is the registry New and Decode check
// against; every Name constant has exactly one entry.
var payloadTypes = map[string]reflect.Type{
	NameSandboxSkipped:       reflect.TypeFor[SandboxSkipped](),
	NameSandboxStarted:       reflect.TypeFor[SandboxStarted](),
	NameSandboxAdopted:       reflect.TypeFor[SandboxAdopted](),
	NameSandboxClaimed:       reflect.TypeFor[SandboxClaimed](),
	NameSandboxForked:        reflect.TypeFor[SandboxForked](),
	NameSnapshotCreated:      reflect.TypeFor[SnapshotCreated](),
	NameSnapshotRestored:     reflect.TypeFor[SnapshotRestored](),
	NameSnapshotDeleted:      reflect.TypeFor[SnapshotDeleted](),
	NameSandboxRecycled:      reflect.TypeFor[SandboxRecycled](),
	NameSandboxStoppedIdle:   reflect.TypeFor[SandboxStoppedIdle](),
	NameSandboxRemoved:       reflect.TypeFor[SandboxRemoved](),
	NameSandboxBuildStarted:  reflect.TypeFor[SandboxBuildStarted](),
	NameSandboxBuildFinished: reflect.TypeFor[SandboxBuildFinished](),
	NameSandboxBuildFailed:   reflect.TypeFor[SandboxBuildFailed](),
	NameSandboxFeatures:      reflect.TypeFor[SandboxFeatures](),
	NameSandboxEnvDenied:     reflect.TypeFor[SandboxEnvDenied](),
	NameSandboxPostCreate:    reflect.TypeFor[SandboxPostCreate](),
	NameDevcontainerDropped:  reflect.TypeFor[DevcontainerDropped](),
	NameSandboxPostStart:     reflect.TypeFor[SandboxPostStart](),
	NameExecStarted:          reflect.TypeFor[ExecStarted](),
	NameExecFinished:         reflect.TypeFor[ExecFinished](),
	NameNetworkBlocked:       reflect.TypeFor[NetworkBlocked](),
	NameCredentialReflected:  reflect.TypeFor[CredentialReflected](),
	NameNetworkBlockedRepeat: reflect.TypeFor[NetworkBlockedRepeats](),
	NamePortForwardOpened:    reflect.TypeFor[PortForwardOpened](),
	NamePortForwardClosed:    reflect.TypeFor[PortForwardClosed](),
	NameProcessStarted:       reflect.TypeFor[ProcessStarted](),
	NameProcessEnded:         reflect.TypeFor[ProcessEnded](),
	NameNetworkUpdated:       reflect.TypeFor[NetworkUpdated](),
	NameSandboxShared:        reflect.TypeFor[SandboxShared](),
	NameHostBindsDropped:     reflect.TypeFor[HostBindsDropped](),
	NameUserRemap:            reflect.TypeFor[UserRemap](),
	NameUIDMismatch:          reflect.TypeFor[UIDMismatch](),
	NameImageEnvPlanted:      reflect.TypeFor[ImageEnvPlanted](),
	NameHostStateMounted:     reflect.TypeFor[HostStateMounted](),
	NameHostServiceOpened:    reflect.TypeFor[HostServiceOpened](),
	NameHostServiceClosed:    reflect.TypeFor[HostServiceClosed](),
	NameHostServiceRefused:   reflect.TypeFor[HostServiceRefused](),
	NameHostServicesDropped:  reflect.TypeFor[HostServicesDropped](),
	NameReaperRemoved:        reflect.TypeFor[ReaperDecision](),
	NameReaperKept:           reflect.TypeFor[ReaperDecision](),
	NameSandboxSuspended:     reflect.TypeFor[SandboxSuspended](),
	NameSandboxResumed:       reflect.TypeFor[SandboxResumed](),
}

// Names returns every event name, in no particular order.
func Names() []string {
	names := make([]string, 0, len(payloadTypes))
	for n := range payloadTypes {
		names = append(names, n)
	}
	return names
}

// New builds the event name for runID (empty: no run) with its payload, stamped with the current time. The
// payload must be the payload type of name (a value or a non-nil pointer to one); anything else is an error, so
// a producer cannot record an event under the wrong name.
func New(runID, name string, payload any) (Event, error) {
	want, ok := payloadTypes[name]
	if !ok {
		return Event{}, fmt.Errorf("new event: unknown event name %q", name)
	}
	v := reflect.ValueOf(payload)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if !v.IsValid() || v.Type() != want {
		return Event{}, fmt.Errorf("new event %s: payload is %T, want events.%s", name, payload, want.Name())
	}
	raw, err := json.Marshal(v.Interface())
	if err != nil {
		return Event{}, fmt.Errorf("new event %s: encode payload: %w", name, err)
	}
	return Event{
		RunID:   runID,
		Time:    Now(),
		Name:    name,
		Payload: raw,
	}, nil
}

// Decode returns the typed payload of e (a value of the payload type of e.Name, e.g. ExecFinished). Unknown
// fields are an error: an event that does not match its type is not silently read as half of one.
func (e Event) Decode() (any, error) {
	t, ok := payloadTypes[e.Name]
	if !ok {
		return nil, fmt.Errorf("decode event %d: unknown event name %q", e.Seq, e.Name)
	}
	p := reflect.New(t)
	dec := json.NewDecoder(bytes.NewReader(e.Payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(p.Interface()); err != nil {
		return nil, fmt.Errorf("decode event %d (%s): %w", e.Seq, e.Name, err)
	}
	return p.Elem().Interface(), nil
}

// Now returns the current time as events and runs store it: UTC, truncated to the millisecond.
func Now() time.Time { return Truncate(time.Now()) }

// Truncate returns t in UTC, truncated to the millisecond, the precision every store keeps.
func Truncate(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }
