package main

// ring keeps the last size bytes of a stream and counts every byte ever written, so that a reader who remembers
// an offset gets what it has not seen yet, or learns how much it lost. It allocates as it fills, never beyond size.
// Not safe for concurrent use: its process's lock guards it.
type ring struct {
	size  int
	buf   []byte // the kept bytes; once full (len == size), the oldest is at head
	head  int
	full  bool
	total int64 // bytes ever written
}

func newRing(size int) *ring { return &ring{size: size} }

func (r *ring) write(p []byte) {
	r.total += int64(len(p))
	if len(p) >= r.size {
		r.buf = append(r.buf[:0], p[len(p)-r.size:]...)
		r.head, r.full = 0, true
		return
	}
	if !r.full {
		n := min(r.size-len(r.buf), len(p))
		r.buf = append(r.buf, p[:n]...)
		p = p[n:]
		if len(r.buf) < r.size {
			return
		}
		r.full, r.head = true, 0
	}
	for len(p) > 0 {
		n := copy(r.buf[r.head:], p)
		r.head = (r.head + n) % r.size
		p = p[n:]
	}
}

// since returns up to limit bytes from offset off (an absolute count of bytes written), the offset after them,
// and how many bytes from off on had already left the ring.
func (r *ring) since(off int64, limit int) (chunk []byte, next, dropped int64) {
	start := r.total - int64(len(r.buf))
	if off < start {
		dropped, off = start-off, start
	}
	n := int(min(r.total-off, int64(limit)))
	if n <= 0 {
		return nil, off, dropped
	}
	chunk = make([]byte, 0, n)
	i := int(off - start)
	if !r.full {
		chunk = append(chunk, r.buf[i:i+n]...)
	} else {
		for len(chunk) < n {
			p := (r.head + i) % r.size
			k := min(n-len(chunk), r.size-p)
			chunk = append(chunk, r.buf[p:p+k]...)
			i += k
		}
	}
	return chunk, off + int64(n), dropped
}
