package link

import (
	"math/rand/v2"
	"time"
)

// jitter is the "full jitter" back-off: a delay drawn uniformly from [0, ceiling), where the
// ceiling is lo·2^attempt capped at hi. Spreading the whole range (rather than adding a little
// noise to a fixed delay) is what keeps a fleet that lost its broker from reconnecting in waves.
func jitter(r *rand.Rand, lo, hi time.Duration, attempt int) time.Duration {
	ceiling := lo
	for i := 0; i < attempt && ceiling < hi; i++ {
		if ceiling > hi/2 { // doubling would pass hi (or overflow)
			ceiling = hi
			break
		}
		ceiling *= 2
	}
	ceiling = min(ceiling, hi)
	if ceiling <= 0 {
		return 0
	}
	return time.Duration(r.Int64N(int64(ceiling)))
}

// backoff counts failed attempts; it is only used by Run's goroutine.
type backoff struct {
	lo, hi  time.Duration
	r       *rand.Rand
	attempt int
}

func newBackoff(lo, hi time.Duration, r *rand.Rand) *backoff {
	return &backoff{lo: lo, hi: hi, r: r}
}

// next returns the delay before the next attempt and counts this one.
func (b *backoff) next() time.Duration {
	d := jitter(b.r, b.lo, b.hi, b.attempt)
	if b.attempt < 64 { // beyond that the ceiling is hi anyway
		b.attempt++
	}
	return d
}

// reset starts over, after a connection that stayed up long enough to count as healthy.
func (b *backoff) reset() { b.attempt = 0 }
