package engine

// Facade reaches the engine behind package sandkeep's values; package sandkeep fills it when it is initialised.
// It serves the public packages beside the root (processes, snapshots: the parts of the API a library user reads
// when they need them, docs/ARCHITECTURE.md) and this module's operator tools (internal/doctor: what admission
// would decide, the drivers, their capacity). An outside module cannot import this package, so it is no way
// around the public API.
var Facade struct {
	Manager    func(m any) *Manager    // a *sandkeep.Manager's engine
	Run        func(r any) *Run        // a *sandkeep.Run's engine (nil for a Run made by hand)
	RunRequest func(rr any) RunRequest // a sandkeep.RunRequest as the engine takes it
	Sandbox    func(sb Sandbox) any    // sb as a sandkeep.Sandbox
}
