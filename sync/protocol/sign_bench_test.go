package protocol

import (
	"crypto/ed25519"
	"fmt"
	"testing"
)

// What a node spends verifying a signed index (the signature over every entry's key, generation and
// digest), by the size of its desired set: the load-independent part of
// mqtt_apply_to_running_signed_ms (BENCHMARKS.md).
func BenchmarkVerifyIndex(b *testing.B) {
	pub, key, _ := ed25519.GenerateKey(nil)
	for _, n := range []int{50, 1000} {
		x := &Index{APIVersion: APIVersion, Node: "edge-1", Revision: int64(n), Objects: map[string]IndexEntry{}}
		for i := range n {
			x.Objects[fmt.Sprintf("pods/default/p%04d", i)] = IndexEntry{Generation: int64(i + 1), Digest: Digest([]byte(fmt.Sprint(i)))}
		}
		SignIndex(x, key)
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			for b.Loop() {
				if err := VerifyIndex(x, []ed25519.PublicKey{pub}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
