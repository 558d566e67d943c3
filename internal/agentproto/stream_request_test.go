package agentproto

import (
	"errors"
	"testing"
)

// TestRequestStreamLimit: only a Stream request (the file API's downloads through the agent) may ask for a
// stdout limit past MaxOutputLimit, up to MaxStreamLimit; stderr stays bounded either way (and an agent that
// predates the field reads it as false, so it refuses the limit).
func TestRequestStreamLimit(t *testing.T) {
	base := Request{Version: Version, ID: 1, Argv: []string{"x"}, TimeoutMS: 1, StdoutLimit: MaxOutputLimit + 1, StderrLimit: 1}
	if err := base.Validate(); !errors.Is(err, ErrBadRequest) {
		t.Errorf("a command's stdout limit past MaxOutputLimit: %v", err)
	}
	s := base
	s.Stream = true
	if err := s.Validate(); err != nil {
		t.Errorf("a stream's stdout limit past MaxOutputLimit: %v", err)
	}
	s.StdoutLimit = MaxStreamLimit + 1
	if err := s.Validate(); !errors.Is(err, ErrBadRequest) {
		t.Errorf("a stream's stdout limit past MaxStreamLimit: %v", err)
	}
	s.StdoutLimit, s.StderrLimit = 1, MaxOutputLimit+1
	if err := s.Validate(); !errors.Is(err, ErrBadRequest) {
		t.Errorf("a stream's stderr limit past MaxOutputLimit: %v", err)
	}
}
