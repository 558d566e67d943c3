package api

import (
	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/processes"
	"github.com/sandkeep/sandkeep/snapshots"
	"github.com/sandkeep/sandkeep/wire"
)

// The library's values as the wire's bodies (package wire: the one declaration the server and the client
// share). The fields are the same; the conversions keep the library's types free to grow without changing
// what a client decodes.

func wireError(fe *fault.Error) wire.Error {
	return wire.Error{Code: string(fe.Code), Message: fe.Message, Hint: fe.Hint}
}

func execResponse(res *sandkeep.ExecResult, id string) ExecResponse {
	return wire.ExecResult{ExitCode: res.ExitCode, TimedOut: res.TimedOut, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated, DurationMS: res.DurationMS,
		Transport: res.Transport, Sandbox: wire.SandboxRef(res.Sandbox), RequestID: id}
}

func runAdmitted(r *sandkeep.Run, id string) RunStarted {
	return wire.RunAdmitted{ID: r.ID, Tenant: r.Tenant, User: r.User, Mode: r.Mode, Source: r.Source, Trust: r.Trust,
		Driver: r.Driver, Admission: r.Admission, Template: r.Template, Warnings: r.Warnings, Notice: r.Notice,
		Dropped: r.Dropped, RequestID: id}
}

func wireProcess(p *processes.Process, id string) ProcessResponse {
	return wire.Process{PID: p.PID, Tag: p.Tag, Argv: p.Argv, Workdir: p.Workdir, TTY: p.TTY, Stdin: p.Stdin,
		Started: p.Started, Running: p.Running, ExitCode: p.ExitCode, Signal: p.Signal, TimedOut: p.TimedOut,
		Killed: p.Killed, StartError: p.StartError, StdoutDropped: p.StdoutDropped, StderrDropped: p.StderrDropped,
		Sandbox: p.Sandbox, RequestID: id}
}

func wireProcesses(in []processes.Process) []wire.Process {
	out := make([]wire.Process, 0, len(in))
	for i := range in {
		out = append(out, wireProcess(&in[i], ""))
	}
	return out
}

func wireSnapshots(in []snapshots.Snapshot) []wire.Snapshot {
	out := make([]wire.Snapshot, 0, len(in))
	for _, sn := range in {
		out = append(out, wire.Snapshot(sn))
	}
	return out
}

func wireSandboxes(in []sandkeep.Sandbox) []wire.Sandbox {
	out := make([]wire.Sandbox, 0, len(in))
	for _, sb := range in {
		w := wire.Sandbox{Tenant: sb.Tenant, User: sb.User, Key: sb.Key, Name: sb.Name, ID: sb.ID, State: sb.State,
			Image: sb.Image, Template: sb.Template, CreatedAt: sb.CreatedAt, LastUsed: sb.LastUsed, IdleFor: sb.IdleFor}
		if sb.Disk != nil {
			d := wire.DiskUsage(*sb.Disk)
			w.Disk = &d
		}
		out = append(out, w)
	}
	return out
}

func wirePorts(in []sandkeep.ForwardPort) []wire.ForwardPort {
	out := make([]wire.ForwardPort, 0, len(in))
	for _, f := range in {
		out = append(out, wire.ForwardPort(f))
	}
	return out
}
