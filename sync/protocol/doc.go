// Package protocol will hold mqlet's MQTT contract: topic names and payload types shared by the
// agent, `mqlet ctl` and mqlet-bridge (docs/protocol.md describes it). The MQTT side lives under
// the top-level sync/ directory in packages whose names do not shadow the standard library's sync
// (protocol, mqtt, ...). Nothing under sync/ may import containerd, and nothing in agent/ may
// import an MQTT library: internal/layering's test enforces both.
package protocol
