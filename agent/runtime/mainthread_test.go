package runtime

import goruntime "runtime"

// The sandbox makes namespaces by unshare on a locked thread that the Go runtime then throws away.
// The main thread cannot be thrown away: a goroutine that happened to run on it would leave it (and
// so /proc/self/ns/*, which the tests compare against) in a pod's namespace. Keeping the main
// goroutine on the main thread keeps every other goroutine off it, as cmd/mqlet does.
func init() { goruntime.LockOSThread() }
