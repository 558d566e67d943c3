package engine

// Facade reaches the engine behind package sandkeep's values; package sandkeep fills it when it is initialised.
// It serves this module's operator tools (internal/doctor: what admission would decide, the drivers, their
// capacity), which are no part of the public API a library user reads (docs/ARCHITECTURE.md, issue 26). An
// outside module cannot import this package, so it is no way around the public API.
var Facade struct {
	Manager    func(m any) *Manager    // a *sandkeep.Manager's engine
	RunRequest func(rr any) RunRequest // a sandkeep.RunRequest as the engine takes it
}
