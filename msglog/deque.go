package msglog

// deque is a FIFO slice with amortised O(1) push and pop: popping moves a
// head index, and the live part is copied down only when the backing array
// is full and at least half of it is popped. (Re-slicing s[1:] instead makes
// every append past the shrinking capacity reallocate.)
type deque[T any] struct {
	buf  []T
	head int
}

func (d *deque[T]) len() int { return len(d.buf) - d.head }

// live returns the elements, oldest first; valid until the next push or pop.
func (d *deque[T]) live() []T { return d.buf[d.head:] }

func (d *deque[T]) push(v T) {
	if len(d.buf) == cap(d.buf) && d.head > 0 && d.head >= len(d.buf)/2 {
		n := copy(d.buf, d.buf[d.head:])
		clear(d.buf[n:])
		d.buf, d.head = d.buf[:n], 0
	}
	d.buf = append(d.buf, v)
}

// popFront drops the oldest n elements.
func (d *deque[T]) popFront(n int) {
	clear(d.buf[d.head : d.head+n])
	d.head += n
	if d.head == len(d.buf) {
		d.buf, d.head = d.buf[:0], 0
		if cap(d.buf) > 1024 {
			d.buf = nil // give a large idle array back
		}
	}
}

func (d *deque[T]) reset() { *d = deque[T]{} }
