package sandkeep

import "context"

// Capacity is how many sandboxes of each shape a driver's room holds (doctor's "capacity" check).
type Capacity struct {
	Driver      string
	Source      string  // where the room's figures come from, in words
	Nodes       int     //
	CPUs        float64 // what sandboxes can reserve in all; 0: unknown or unbounded
	MemoryBytes int64   // 0: unknown or unbounded
	Shapes      []ShapeCapacity
}

// ShapeCapacity is one shape's reservation (its template's requests, else its limits) and how many of its
// sandboxes fit the room; Fits is -1 when the room is unknown.
type ShapeCapacity struct {
	Template    string // "" for the Config's own shape
	CPUs        float64
	MemoryBytes int64
	Fits        int64
}

// Capacity asks the driver named drv what its sandboxes can reserve in all (a cluster's schedulable nodes, else
// its namespace's quota; a Docker host's CPUs and memory) and divides it by each shape's reservation: the
// Config's shape, then every template's by name. nil for a driver that reserves nothing (the host).
func (m *Manager) Capacity(ctx context.Context, drv string) (*Capacity, error) {
	c, err := m.e.Capacity(ctx, drv)
	if c == nil {
		return nil, err
	}
	out := &Capacity{Driver: c.Driver, Source: c.Source, Nodes: c.Nodes, CPUs: c.CPUs, MemoryBytes: c.MemoryBytes}
	for _, s := range c.Shapes {
		out.Shapes = append(out.Shapes, ShapeCapacity(s))
	}
	return out, err
}
