package nodestatus

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
)

// NetworkUnavailable's reasons: kubelet's for a network plugin that is not ready, and ours for one
// that is.
const (
	ReasonNetworkPluginNotReady = "NetworkPluginNotReady"
	ReasonNetworkReady          = "NetworkPluginReady"
	messageNetworkReady         = "pod network (CNI) is configured and its plugins are present"
	// MessageNetworkNotReady starts Ready's message while pod networking is down, as kubelet's
	// "container runtime network not ready" does.
	MessageNetworkNotReady = "pod network not ready: "
)

// NetworkCondition sets NetworkUnavailable from ready (nil: pods can be attached): True with the
// reason (the configuration file or the missing plugin) while pods cannot get a network, False
// otherwise. Ready must also turn False then (NetworkReady wraps the agent's readiness for it).
func NetworkCondition(ready func() error, now func() time.Time) Setter {
	return func(_ context.Context, n *v1.Node) error {
		if err := ready(); err != nil {
			setCondition(n, v1.NodeNetworkUnavailable, v1.ConditionTrue, ReasonNetworkPluginNotReady, err.Error(), now())
		} else {
			setCondition(n, v1.NodeNetworkUnavailable, v1.ConditionFalse, ReasonNetworkReady, messageNetworkReady, now())
		}
		return nil
	}
}

// NetworkReady is agent joined with network for ReadyCondition: the node is not Ready while pods
// cannot get a network, as kubelet reports a runtime whose network is not ready. Both reasons are
// given when both fail, the agent's first.
func NetworkReady(agent, network func() error) func() error {
	return func() error {
		var agentErr error
		if agent != nil {
			agentErr = agent()
		}
		netErr := network()
		switch {
		case netErr == nil:
			return agentErr
		case agentErr == nil:
			return &networkNotReady{netErr}
		}
		return fmt.Errorf("%w, %w", agentErr, &networkNotReady{netErr})
	}
}

type networkNotReady struct{ err error }

func (e *networkNotReady) Error() string { return MessageNetworkNotReady + e.err.Error() }
func (e *networkNotReady) Unwrap() error { return e.err }
