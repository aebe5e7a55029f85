// Package protocol is mqlet's MQTT contract: the topic tree and the payload types shared by the
// agent, `mqlet ctl` and mqlet-bridge. docs/protocol.md explains every choice; this package is the
// single place the names and shapes are written down in code.
//
// The MQTT side lives under the top-level sync/ directory in packages whose names do not shadow the
// standard library's sync. Nothing under sync/ may import containerd, and nothing in agent/ may
// import an MQTT library: internal/layering's test enforces both.
package protocol
