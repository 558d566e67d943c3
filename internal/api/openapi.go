package api

import (
	_ "embed"
	"net/http"
)

// openAPI is the OpenAPI 3.1 description of this API, written by hand next to the handlers it describes.
// TestOpenAPICoversRoutes fails when a registered route is missing from it.
//
//go:embed openapi.json
var openAPI []byte

func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(openAPI)
}
