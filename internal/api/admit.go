package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/wire"
)

// RunStartBody is the JSON of POST /v1/sandboxes/{user}/runs: what a caller may say about a run.
type RunStartBody = wire.RunStart

// RunStarted is the answer: the run as admission recorded it. Commands attach with exec's run_id.
type RunStarted = wire.RunAdmitted

// RunFinishBody is the JSON of POST /v1/runs/{id}/finish.
type RunFinishBody = wire.RunFinish

// TemplateList is the answer of GET /v1/templates.
type TemplateList = wire.TemplateList

// handleStartRun admits a run through the same admission as exec's implicit runs, and records it.
func (s *Server) handleStartRun(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var b RunStartBody
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, s.maxBody), &b, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := infoOf(r).id
	run, err := s.backend.Admit(r.Context(), key, service.AdmitRequest{Template: b.Template, Trust: b.Trust, RequestID: id})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, runAdmitted(run, id))
}

// handleFinishRun closes a running run of the token's tenant.
func (s *Server) handleFinishRun(w http.ResponseWriter, r *http.Request) {
	run, err := s.runOf(r.Context(), tenantOf(r), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var b RunFinishBody
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, s.maxBody), &b, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if run.Status != store.StatusRunning {
		s.writeError(w, r, fault.New(fault.InvalidArgument, "only a running run can be finished", "run %s is %s", run.ID, run.Status))
		return
	}
	if err := s.backend.EndRun(r.Context(), run.ID, b.Failed); err != nil {
		s.writeError(w, r, err)
		return
	}
	run, err = s.runOf(r.Context(), tenantOf(r), run.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

// handleTemplates lists the templates the token's tenant may use.
func (s *Server) handleTemplates(w http.ResponseWriter, r *http.Request) {
	names, err := s.backend.Templates(r.Context(), tenantOf(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if names == nil {
		names = []string{}
	}
	writeJSON(w, http.StatusOK, TemplateList{Templates: names})
}

// decodeStrict reads one JSON object into v, refusing unknown fields and trailing data; with emptyOK an empty
// body is the zero object.
func decodeStrict(rd io.Reader, v any, emptyOK bool) error {
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if emptyOK && errors.Is(err, io.EOF) {
			return nil
		}
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("send exactly one JSON object", "the request body has data after its JSON object")
	}
	return nil
}
