package mq

import (
	"github.com/mqlet/mqlet/sync/logsclient"
	"github.com/mqlet/mqlet/sync/stream"
)

// The connection's request/reply view is what the logs client and the exec client run over.
var (
	_ logsclient.Broker = Requests{}
	_ stream.Transport  = Requests{}
)
