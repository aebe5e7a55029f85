// Package loopback finds free ports on 127.0.0.1 for the brokers that tests and benchmarks start.
package loopback

import (
	"fmt"
	"net"
)

// FreePorts returns n distinct loopback ports that were free a moment ago. All n listeners are held
// until every port is picked, so the same port is never returned twice; another process may still
// take one before the caller binds it (callers retry on "address in use").
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ps []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ps = append(ps, l.Addr().(*net.TCPAddr).Port)
	}
	return ps, nil
}
