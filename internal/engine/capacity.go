package engine

import (
	"context"
	"maps"
	"slices"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
)

// Capacity is how many sandboxes of each shape the driver's room holds: what each reserves (its template's
// requests, else its limits) against what the driver reports sandboxes can reserve in all.
type Capacity struct {
	Driver      string
	Source      string // where the room's figures come from, in words
	Nodes       int
	CPUs        float64 // 0: unknown or unbounded
	MemoryBytes int64   // 0: unknown or unbounded
	Shapes      []ShapeCapacity
}

// ShapeCapacity is one shape's reservation and how many of its sandboxes fit the room (-1: unknown).
type ShapeCapacity struct {
	Template    string // "" for the Config's own shape
	CPUs        float64
	MemoryBytes int64
	Fits        int64
}

// Capacity asks the driver named drv for its room and divides it by each shape's reservation: the Config's
// shape and every template's, sorted by template name. A driver that reserves nothing (the host) answers nil.
func (m *Manager) Capacity(ctx context.Context, drv string) (*Capacity, error) {
	d, err := m.drivers.get(drv)
	if err != nil {
		return nil, err
	}
	cr, ok := d.(driver.CapacityReporter)
	if !ok {
		return nil, nil
	}
	room, err := cr.Capacity(ctx)
	if err != nil {
		return nil, err
	}
	out := &Capacity{Driver: drv, Source: room.Source, Nodes: room.Nodes, CPUs: float64(room.MilliCPUs) / 1000,
		MemoryBytes: room.MemoryBytes}
	cpus, mem := m.cfg.CPUs, m.cfg.MemoryBytes
	if cpus <= 0 {
		cpus = float64(lifecycle.DefaultNanoCPUs) / 1e9
	}
	if mem <= 0 {
		mem = lifecycle.DefaultMemory
	}
	out.Shapes = append(out.Shapes, shapeCapacity(room, "", cpus, mem))
	for _, name := range slices.Sorted(maps.Keys(m.cfg.Templates)) {
		t := m.cfg.Templates[name]
		c, b := cpus, mem
		if t.CPUs > 0 {
			c = t.CPUs
		}
		if t.MemoryBytes > 0 {
			b = t.MemoryBytes
		}
		if t.Requests.CPUs > 0 {
			c = t.Requests.CPUs
		}
		if t.Requests.MemoryBytes > 0 {
			b = t.Requests.MemoryBytes
		}
		out.Shapes = append(out.Shapes, shapeCapacity(room, name, c, b))
	}
	return out, nil
}

// shapeCapacity divides the room by one sandbox's reservation: the scarcer of CPU and memory decides; -1 when
// the room is unknown on both.
func shapeCapacity(room driver.Capacity, template string, cpus float64, mem int64) ShapeCapacity {
	s := ShapeCapacity{Template: template, CPUs: cpus, MemoryBytes: mem, Fits: -1}
	milli := max(int64(cpus*1000), 1) // as the kubernetes driver rounds a request: whole millicores, at least 1
	if room.MilliCPUs > 0 {
		s.Fits = room.MilliCPUs / milli
	}
	if room.MemoryBytes > 0 && mem > 0 {
		if n := room.MemoryBytes / mem; s.Fits < 0 || n < s.Fits {
			s.Fits = n
		}
	}
	return s
}
