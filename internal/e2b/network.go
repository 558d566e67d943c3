package e2b

// A sandbox's network, as E2B's create (allow_internet_access, network) and network update ask for it, is the
// caller tier's network block over the operator's template: it may only narrow the template's policy, never
// widen it (egress.Narrow), and what it cannot say is refused rather than dropped. E2B's model is a deny list
// with allowed entries taking precedence; sandkeep's caller block is none or an allowlist, so:
//
//	nothing, or allow_internet_access: true     the template's network as it is
//	allow_internet_access: false, or denyOut
//	  naming all traffic (0.0.0.0/0, ::/0)       none, or an allowlist of allowOut when it lists any
//	allowOut without a deny-all                  an allowlist of allowOut (stricter than E2B, which would
//	                                             allow the rest: failing closed)
//	denyOut of single addresses alone            refused (NETWORK_INVALID): "all but these" is no narrowing
//	                                             sandkeep can apply to every template
//	rules (header transforms), egressProxy       refused: credentials and upstreams are the operator's
//	maskRequestHost, httpsPorts                  refused: sandkeep serves no sandbox URLs
//	allowPublicTraffic                           accepted either way: no sandbox URL exists to be public
//
// An allowOut entry is E2B's: an IP, a CIDR, a name, or "*.name" (any depth below name, not name itself, which
// becomes the rules "**.name" and "!name").

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
)

// networkJSON is E2B's SandboxNetworkConfig (create) and SandboxNetworkUpdateConfig (update, whose
// allow_internet_access travels beside these fields).
type networkJSON struct {
	AllowOut           []string                   `json:"allowOut,omitempty"`
	DenyOut            []string                   `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool                      `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    string                     `json:"maskRequestHost,omitempty"`
	HTTPSPorts         []int                      `json:"httpsPorts,omitempty"`
	EgressProxy        json.RawMessage            `json:"egressProxy,omitempty"`
	Rules              map[string]json.RawMessage `json:"rules,omitempty"`
	// AllowInternetAccess is the update body's allow_internet_access (create sends it beside network).
	AllowInternetAccess *bool `json:"allow_internet_access,omitempty"`
}

// maxNetworkEntries bounds allowOut and denyOut.
const maxNetworkEntries = 256

// parseNetwork reads a network object strictly: a field sandkeep does not know is refused, not dropped.
func parseNetwork(raw json.RawMessage) (*networkJSON, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var n networkJSON
	if err := dec.Decode(&n); err != nil {
		return nil, fault.New(fault.NetworkInvalid, "send allowOut, denyOut and allowPublicTraffic (docs/E2B.md, \"Network\")",
			"the network config is not one sandkeep understands: %v", err)
	}
	return &n, nil
}

// callerNetwork is the caller's network block that allowInternet and n ask for (docs above); nil leaves the
// template's network as it is. Its errors are faults with NETWORK_INVALID or NETWORK_WIDENED.
func callerNetwork(allowInternet *bool, n *networkJSON) (*sandkeep.Network, error) {
	invalid := func(hint, format string, a ...any) error {
		return fault.New(fault.NetworkInvalid, hint, format, a...)
	}
	if n == nil {
		n = &networkJSON{}
	}
	switch {
	case len(n.Rules) > 0:
		return nil, fault.New(fault.NetworkWidened, "ask the operator for a template whose network carries the credential",
			"network rules (header transforms) put credentials on requests, and credentials are the operator's")
	case len(n.EgressProxy) > 0 && string(n.EgressProxy) != "null":
		return nil, invalid("leave egressProxy out: a sandbox's traffic leaves through sandkeep's egress proxy",
			"egressProxy is not supported")
	case n.MaskRequestHost != "" || len(n.HTTPSPorts) > 0:
		return nil, invalid("leave maskRequestHost and httpsPorts out",
			"sandkeep serves no sandbox URLs, so maskRequestHost and httpsPorts have nothing to apply to")
	case len(n.AllowOut) > maxNetworkEntries || len(n.DenyOut) > maxNetworkEntries:
		return nil, invalid("list at most 256 entries", "allowOut or denyOut has more than %d entries", maxNetworkEntries)
	}
	denyAll := allowInternet != nil && !*allowInternet
	for _, d := range n.DenyOut {
		switch strings.TrimSpace(d) {
		case "0.0.0.0/0", "::/0":
			denyAll = true
		case "":
			return nil, invalid("remove the empty entry", "denyOut has an empty entry")
		}
	}
	if len(n.AllowOut) == 0 {
		switch {
		case denyAll:
			return &sandkeep.Network{Mode: "none", Inherit: "replace"}, nil
		case len(n.DenyOut) > 0:
			return nil, invalid("deny all traffic (denyOut: ['0.0.0.0/0']) and list what may be reached in allowOut",
				"denyOut of single addresses without a deny-all is not supported: sandkeep narrows a template's network by an allowlist")
		}
		return nil, nil
	}
	rules := make([]string, 0, len(n.AllowOut))
	for _, a := range n.AllowOut {
		a = strings.TrimSpace(a)
		switch {
		case a == "", strings.HasPrefix(a, "!"), strings.Contains(a, "**"), a == "*":
			return nil, invalid("list IPs, CIDRs, names or *.name", "allowOut entry %q is not one E2B allows", a)
		case strings.HasPrefix(a, "*."):
			name := strings.TrimPrefix(a, "*.")
			rules = append(rules, "**."+name, "!"+name)
		default:
			rules = append(rules, a)
		}
	}
	return &sandkeep.Network{Mode: "allowlist", Rules: rules, Inherit: "replace"}, nil
}

// network is the caller's block of rec's sandbox, as admitted at its create (or its last network update).
func (r *record) network() *sandkeep.Network {
	n, err := callerNetwork(r.AllowInternet, r.Network)
	if err != nil { // admitted once, so not expected; never widen on a record that no longer parses
		return &sandkeep.Network{Mode: "none", Inherit: "replace"}
	}
	return n
}

// admitNetwork admits a run of rec's sandbox with the block allowInternet and n ask for, through the same
// admission as every command (the template's policy narrowed, NETWORK_WIDENED for more; the run recorded,
// refused ones too), and reports whether its commands get a network.
func (f *Front) admitNetwork(r *http.Request, b service.Backend, rec *record, allowInternet *bool, n *networkJSON) (networked bool, err error) {
	run, err := f.admitRun(r, b, rec, allowInternet, n)
	if err != nil {
		return false, err
	}
	defer f.endRun(r, b, run)
	return f.networked(run), nil
}

// admitRun is admitNetwork's run, left open for the caller to record in and end (endRun).
func (f *Front) admitRun(r *http.Request, b service.Backend, rec *record, allowInternet *bool, n *networkJSON) (*sandkeep.Run, error) {
	block, err := callerNetwork(allowInternet, n)
	if err != nil {
		return nil, err
	}
	key, err := keyOf(rec)
	if err != nil {
		return nil, err
	}
	return b.Admit(r.Context(), key, service.AdmitRequest{Template: rec.OpTemplate, Network: block, RequestID: f.requestID(r)})
}

func (f *Front) endRun(r *http.Request, b service.Backend, run *sandkeep.Run) {
	if run.ID != "" {
		_ = b.EndRun(r.Context(), run.ID, false)
	}
}

// startNetwork is the network block a command of sandbox id starts with, read under the lock a network update
// holds while it looks for running commands; the start counts among them from now until started is called,
// once the engine lists the process (or the start failed). So a command runs with the network before an update
// or after it, never between.
func (f *Front) startNetwork(id string) (block *sandkeep.Network, started func(), err error) {
	f.netMu.Lock()
	defer f.netMu.Unlock()
	cur, err := f.recs.get(id)
	if err != nil {
		return nil, nil, err
	}
	f.starting[id]++
	var once sync.Once
	return cur.network(), func() {
		once.Do(func() {
			f.netMu.Lock()
			defer f.netMu.Unlock()
			if f.starting[id]--; f.starting[id] <= 0 {
				delete(f.starting, id)
			}
		})
	}, nil
}

// runningCommands counts the commands of rec's sandbox that run, or start, with the network they read: the front's own
// (the exec path), the starts under way, and the engine's running processes. The caller holds netMu.
func (f *Front) runningCommands(ctx context.Context, rec *record) (int, error) {
	n := len(f.procs.of(rec.ID)) + f.starting[rec.ID]
	b, _ := f.backend()
	pb, ok := f.engineProcs(b)
	if !ok {
		return n, nil
	}
	key, err := keyOf(rec)
	if err != nil {
		return 0, err
	}
	ps, err := pb.Processes(ctx, key)
	if err != nil && !f.unavailable(err) {
		return 0, err
	}
	for i := range ps {
		if ps[i].Running {
			n++
		}
	}
	return n, nil
}

// handleNetwork is E2B's network update (PUT /sandboxes/{id}/network): the new config replaces the sandbox's
// (omitted fields cleared, as E2B's), admitted as at create: it may only narrow the template's network. It
// applies to the commands started after it, and its run records network_updated. A running command of the
// sandbox (one of the engine's processes, or the front's own on the exec path) holds the network it started
// with until it ends (its egress session), so while one runs in a sandbox that has a network the update is
// refused (409) rather than left half applied.
func (f *Front) handleNetwork(w http.ResponseWriter, r *http.Request) {
	_, rec, ok := f.ownedBy(w, r, auth.ScopeExec)
	if !ok {
		return
	}
	raw := json.RawMessage{}
	if err := decode(r, &raw); err != nil {
		f.writeError(w, r, err)
		return
	}
	n, err := parseNetwork(raw)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	if n == nil {
		n = &networkJSON{}
	}
	allow := n.AllowInternetAccess
	n.AllowInternetAccess = nil
	b, _ := f.backend()
	run, err := f.admitRun(r, b, rec, allow, n)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	defer f.endRun(r, b, run)
	networked := f.networked(run)
	f.netMu.Lock()
	defer f.netMu.Unlock()
	cur, err := f.recs.get(rec.ID)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	if cur.Networked {
		busy, err := f.runningCommands(r.Context(), cur)
		if err != nil {
			f.writeError(w, r, err)
			return
		}
		if busy > 0 {
			f.writeError(w, r, &statusError{status: http.StatusConflict, msg: fmtBusy(busy)})
			return
		}
	}
	if _, err := f.recs.update(rec.ID, func(r *record) error {
		r.AllowInternet, r.Network, r.Networked = allow, n, networked
		return nil
	}); err != nil {
		f.writeError(w, r, err)
		return
	}
	f.noteUpdate(run, rec.ID)
	w.WriteHeader(http.StatusNoContent)
}

func fmtBusy(n int) string {
	return fmt.Sprintf("%d command(s) of the sandbox run with the network they started with (a command holds its "+
		"egress session until it ends): kill them (commands.kill) or wait for them to end, then update the network; nothing was changed", n)
}
