package mqtttest

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// What bounds one node that fills the broker with retained messages under its own subtree (the
// ACL lets it): the shipped memory_limit, here lowered to 16 MiB so that the test is quick. The
// node is disconnected once the broker's heap reaches it ("out of memory" in the broker's log);
// the broker stays up and another node still connects and uses its topics.
func TestExampleMemoryLimitStopsAGreedyNode(t *testing.T) {
	f := newFleet(t, Admin, nodeA1, nodeA2)
	const limit = 16 << 20
	b := startExample(t, f, "mosquitto.conf", map[string]string{"\nmemory_limit 2147483648\n": fmt.Sprintf("\nmemory_limit %d\n", limit)})
	greedy, err := tryDial(b.TLS, nodeA1, f.tlsConfig(t, nodeA1))
	if err != nil {
		t.Fatal(err)
	}
	defer greedy.Disconnect(0)
	payload := strings.Repeat("j", 256<<10)
	cut := -1
	for i := range 4 * limit / len(payload) {
		topic := nodeTopic(nodeA1, fmt.Sprintf("status/pods/default/junk-%d", i))
		if err := waitToken(greedy.Publish(topic, 1, true, payload), time.Now().Add(arrive)); err != nil {
			cut = i
			t.Logf("publish %d (%d MiB in all): %v", i, (i+1)*len(payload)>>20, err)
			break
		}
	}
	if cut < 0 {
		t.Fatalf("the broker took %d MiB of retained messages from one node with memory_limit %d MiB", 4*limit>>20, limit>>20)
	}
	if !strings.Contains(tail(b.LogFile, 50), "Client "+nodeA1+" disconnected due to out of memory") {
		t.Fatalf("the broker's log does not say it disconnected %s for memory:\n%s", nodeA1, tail(b.LogFile, 20))
	}
	if b.Pid() == 0 {
		t.Fatal("the broker is gone")
	}
	other := dial(t, b.TLS, nodeA2, f.tlsConfig(t, nodeA2))
	mine, _ := subscribe(t, other, nodeTopic(nodeA2, "#"))
	publish(t, other, nodeTopic(nodeA2, "status/node"), true, "ok")
	expect(t, mine, nodeTopic(nodeA2, "status/node"), "ok")
}
