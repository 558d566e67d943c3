package engine

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Host services (Config.HostServices, Template.Services): the operator's host endpoints offered inside the
// sandboxes of a template's runs, each behind a bearer token minted for the run (lifecycle/services.go carries
// them). Operator tier only: a repository's services are TIER_REFUSED by the tier check, and a caller only picks
// a template.

// hostServices parses Config.HostServices into the lifecycle's sorted list.
func hostServices(in map[string]string) ([]lifecycle.HostService, error) {
	names := make([]string, 0, len(in))
	for n := range in {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]lifecycle.HostService, 0, len(names))
	for _, n := range names {
		s, err := lifecycle.ParseHostService(n, in[n])
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	if len(out) > lifecycle.MaxHostServices {
		return nil, fault.New(fault.InvalidArgument, fmt.Sprintf("offer at most %d host services", lifecycle.MaxHostServices),
			"%d host services configured", len(out))
	}
	return out, nil
}

// checkServices refuses a template that lists a service the Config does not offer, or one twice.
func (m *Manager) checkServices(name string, t Template) error {
	for i, s := range t.Services {
		if _, ok := m.cfg.HostServices[s]; !ok || slices.Contains(t.Services[:i], s) {
			return fault.New(fault.InvalidArgument, "define the service under host_services, and list it once",
				"template %q lists host service %q, which is not defined (or is listed twice)", name, s)
		}
	}
	return nil
}

// resolveServices decides the run's host services at admission, before its sandbox exists: its template's,
// under a token minted for this run, or none with a host_services_dropped event when the run's driver cannot
// carry them (the host passthrough, kubernetes, gVisor).
func (r *Run) resolveServices(tpl *template, onHost bool) error {
	if tpl == nil || len(tpl.Services) == 0 {
		return nil
	}
	why := "the command runs on the host passthrough, with no sandbox to carry them into"
	ok := false
	if !onHost {
		ok, why = r.lc.CarriesServices(r.key)
	}
	if !ok {
		if r.owned {
			r.event(events.NameHostServicesDropped, events.HostServicesDropped{Driver: r.Driver,
				Services: slices.Clone(tpl.Services), Why: why})
		}
		return nil
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("host service token: %w", err)
	}
	token := hex.EncodeToString(b)
	for _, s := range tpl.Services {
		r.services = append(r.services, lifecycle.ServiceGrant{Name: s, Token: token})
	}
	return nil
}
