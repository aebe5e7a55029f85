// Command mqttfloor is the floor of the bench's idle-link figure: a bare paho client that connects
// with the agent's MQTT settings (client id, keepalive, clean session, MQTT 3.1.1) and then does
// nothing at all, so the bytes it costs are what any MQTT connection with that keepalive costs.
// The harness (tools/bench) starts it, counts its bytes with iptables and stops it with SIGTERM.
//
// -tcp-keepalive=false turns off the kernel's TCP keepalive probes on the socket (Go's dialer
// enables them, every 15 s of idleness, unless told otherwise); with the default, the client uses
// paho's own default dialer untouched.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

func main() {
	broker := flag.String("broker", "", "broker URL, tcp://HOST:PORT")
	clientID := flag.String("client-id", "", "MQTT client id (the agent's node name)")
	keepalive := flag.Duration("keepalive", 60*time.Second, "MQTT keepalive (the agent's default is 60s)")
	tcpKeepalive := flag.Bool("tcp-keepalive", true, "leave Go's TCP keepalive probes on (paho's default dialer); false disables them")
	flag.Parse()
	if *broker == "" || *clientID == "" {
		fmt.Fprintln(os.Stderr, "mqttfloor: -broker and -client-id are required")
		os.Exit(2)
	}
	lost := make(chan error, 1)
	o := mqtt.NewClientOptions().
		AddBroker(*broker).
		SetClientID(*clientID).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetKeepAlive(*keepalive).
		SetAutoReconnect(false).
		SetConnectTimeout(10 * time.Second).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) { lost <- err })
	if !*tcpKeepalive {
		o.SetDialer(&net.Dialer{Timeout: 10 * time.Second, KeepAlive: -1})
	}
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
		fmt.Fprintf(os.Stderr, "mqttfloor: connect %s: %v\n", *broker, tok.Error())
		os.Exit(1)
	}
	fmt.Printf("connected %s as %s keepalive %s tcp-keepalive %t\n", *broker, *clientID, *keepalive, *tcpKeepalive)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		c.Disconnect(250)
	case err := <-lost:
		fmt.Fprintf(os.Stderr, "mqttfloor: connection lost: %v\n", err)
		os.Exit(1)
	}
}
