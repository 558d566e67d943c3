package main

import (
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sandkeep/sandkeep/internal/ui"
)

// serveRegistry is the Prometheus registry `sandkeep serve` hands to the API (served at /metrics) and to the
// dashboard (its latency page), with the Go and process collectors the API would add to a private one.
func serveRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// mountUI serves the dashboard (internal/ui, docs/UI.md) at /ui/ beside hs's handler (the API), over the same
// backend, store and registry, and ends its live streams when hs shuts down.
// operatorToken is the installation operator's dashboard credential: every tenant's sandboxes and runs, which no
// tenant's token (admin or not) shows.
func mountUI(hs *http.Server, svc *openedService, reg prometheus.Gatherer, log *slog.Logger, operatorToken string) error {
	u, err := ui.New(ui.Config{Backend: svc.backend, Store: svc.st, Tokens: svc.st, Gatherer: reg, Logger: log, OperatorToken: operatorToken})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(ui.Prefix, u)
	mux.Handle("/", hs.Handler)
	hs.Handler = mux
	hs.RegisterOnShutdown(u.Close)
	return nil
}
