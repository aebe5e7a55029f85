package event

// Reasons of the events kubelet records about a pod's lifecycle, spelled as kubelet spells them
// (its pkg/kubelet/events), so that what users grep for and alert on means the same on mqlet.
const (
	// ReasonPulling: an image pull begins.
	ReasonPulling = "Pulling"
	// ReasonPulled: an image was pulled, or found present already.
	ReasonPulled = "Pulled"
	// ReasonCreated: a container was created.
	ReasonCreated = "Created"
	// ReasonStarted: a container was started.
	ReasonStarted = "Started"
	// ReasonKilling: a running container is being stopped.
	ReasonKilling = "Killing"
	// ReasonBackOff: a container (or an image pull) waits out its restart back-off.
	ReasonBackOff = "BackOff"
	// ReasonFailed: a container could not be pulled, created or started.
	ReasonFailed = "Failed"
	// ReasonDeadlineExceeded: the pod ran longer than its activeDeadlineSeconds.
	ReasonDeadlineExceeded = "DeadlineExceeded"
)
