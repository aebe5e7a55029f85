package link

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func seeded() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

// Full jitter: every delay lies in [0, min(max, min·2^attempt)), and the draws spread over that
// whole range (the largest of many draws comes close to the ceiling, the smallest close to 0).
func TestJitterBoundsAndGrowth(t *testing.T) {
	const lo, hi = time.Second, 2 * time.Minute
	r := seeded()
	for attempt := range 12 {
		ceiling := min(hi, lo<<attempt)
		smallest, largest := time.Duration(math.MaxInt64), time.Duration(0)
		for range 2000 {
			d := jitter(r, lo, hi, attempt)
			if d < 0 || d >= ceiling {
				t.Fatalf("attempt %d: delay %s outside [0, %s)", attempt, d, ceiling)
			}
			smallest, largest = min(smallest, d), max(largest, d)
		}
		if largest < ceiling*9/10 || smallest > ceiling/10 {
			t.Errorf("attempt %d: draws span [%s, %s], want most of [0, %s)", attempt, smallest, largest, ceiling)
		}
	}
}

// The ceiling stops at max, also for attempt counts whose 2^attempt would overflow.
func TestJitterCap(t *testing.T) {
	r := seeded()
	for _, attempt := range []int{7, 8, 40, 63, 64, 1000} {
		for range 500 {
			if d := jitter(r, time.Second, 2*time.Minute, attempt); d < 0 || d >= 2*time.Minute {
				t.Fatalf("attempt %d: delay %s outside [0, 2m)", attempt, d)
			}
		}
	}
	huge := time.Duration(math.MaxInt64)
	for _, attempt := range []int{0, 1, 2, 10, 100} {
		if d := jitter(r, huge/3, huge, attempt); d < 0 || d >= huge {
			t.Fatalf("attempt %d near the int64 limit: delay %d", attempt, d)
		}
	}
	if d := jitter(r, time.Second, time.Second, 5); d >= time.Second {
		t.Errorf("min == max: delay %s, want under 1s", d)
	}
}

// backoff counts attempts (the ceiling doubles per next), and reset starts over at min.
func TestBackoffGrowsAndResets(t *testing.T) {
	const lo, hi = 100 * time.Millisecond, 10 * time.Second
	// The same seed gives the same sequence: compare against jitter's own ceilings.
	b := newBackoff(lo, hi, seeded())
	for attempt := range 10 {
		ceiling := min(hi, lo<<attempt)
		if d := b.next(); d >= ceiling {
			t.Fatalf("next #%d = %s, want under %s", attempt, d, ceiling)
		}
	}
	if b.attempt != 10 {
		t.Errorf("attempt count %d after 10 next, want 10", b.attempt)
	}
	// The ceiling has grown: over many draws some exceed min.
	grown := false
	for range 50 {
		if b.next() > lo {
			grown = true
		}
	}
	if !grown {
		t.Error("after many attempts no delay exceeds min: the back-off does not grow")
	}
	b.reset()
	for range 200 {
		b.reset()
		if d := b.next(); d >= lo {
			t.Fatalf("first delay after reset %s, want under min %s", d, lo)
		}
	}
	// Deterministic for a seed: two back-offs with the same seed agree.
	x, y := newBackoff(lo, hi, seeded()), newBackoff(lo, hi, seeded())
	for i := range 20 {
		if a, b := x.next(), y.next(); a != b {
			t.Fatalf("draw %d differs for the same seed: %s vs %s", i, a, b)
		}
	}
}
