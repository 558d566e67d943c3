package api

import (
	"net/http"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/wire"
)

// SandboxList is the answer of GET /v1/sandboxes.
type SandboxList = wire.SandboxList

func (s *Server) handleSandboxes(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r.URL.Query()); err != nil {
		s.writeError(w, r, err)
		return
	}
	boxes, err := s.backend.List(r.Context(), tenantOf(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if boxes == nil {
		boxes = []sandkeep.Sandbox{}
	}
	writeJSON(w, http.StatusOK, SandboxList{Sandboxes: wireSandboxes(boxes)})
}

func (s *Server) handleSandbox(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.backend.Sandbox(r.Context(), key)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) handleStop(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.backend.Stop(r.Context(), key); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleRemove(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.backend.Remove(r.Context(), key); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
