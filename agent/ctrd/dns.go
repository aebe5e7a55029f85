package ctrd

// The pod's /etc/resolv.conf, /etc/hosts and /etc/hostname, as kubelet (hosts) and containerd's CRI
// (resolv.conf, hostname) make them: one copy of each in the pod dir, bind-mounted into every
// container of the pod.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/internal/atomicfile"
)

// DNS is the node's DNS settings for pods: kubelet's clusterDNS, clusterDomain and resolvConf. The
// zero value has no cluster DNS and no host resolver file.
type DNS struct {
	// ClusterDNS are the servers of ClusterFirst pods; with none, ClusterFirst falls back to
	// Default, as kubelet's does, and says so in a warning event.
	ClusterDNS []string
	// ClusterDomain (cluster.local) heads the search list of ClusterFirst pods and ends the FQDN
	// of pods with a subdomain.
	ClusterDomain string
	// ResolvConf is the host's resolver file: what Default pods get, and the tail of ClusterFirst
	// pods' search list. "" means none: Default pods then ask only the resolver on localhost.
	ResolvConf string
}

// SandboxWarning is something the sandbox set-up wants told as a Warning event on the pod.
type SandboxWarning struct{ Reason, Message string }

// Event reasons, kubelet's.
const (
	ReasonMissingClusterDNS = "MissingClusterDNS"
	ReasonDNSConfigForming  = "DNSConfigForming"
)

// The resolver's limits as the API server and kubelet apply them (glibc reads 3 nameservers; the
// search list limits are the "expanded" ones every current Kubernetes uses).
const (
	maxNameservers       = 3
	maxSearches          = 32
	maxSearchListChars   = 2048
	maxSearchDomainChars = validation.DNS1123SubdomainMaxLength // glibc 2.28 aborts on longer ones
	maxHostnameChars     = 64                                   // the kernel's HOST_NAME_MAX
	clusterFirstNdots    = "ndots:5"
	hostHostsFile        = "/etc/hosts"
)

// Where the files go in the container.
const (
	etcHosts      = "/etc/hosts"
	etcResolvConf = "/etc/resolv.conf"
	etcHostname   = "/etc/hostname"
)

// resolver is what a resolv.conf says.
type resolver struct {
	Servers, Searches, Options []string
}

// parseResolvConf reads a resolv.conf the way kubelet reads the host's: nameserver lines add up,
// the last search line and the last options line win. A trailing dot on a search domain is dropped
// so that "a.b" and "a.b." count once; "domain" and unknown lines are ignored.
func parseResolvConf(b []byte) resolver {
	var rv resolver
	for line := range strings.Lines(string(b)) {
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			rv.Servers = append(rv.Servers, f[1])
		case "search":
			rv.Searches = nil
			for _, s := range f[1:] {
				if s = strings.TrimSuffix(s, "."); s != "" {
					rv.Searches = append(rv.Searches, s)
				}
			}
		case "options":
			rv.Options = slices.Clone(f[1:])
		}
	}
	return rv
}

// render writes rv as containerd's CRI writes a sandbox's resolv.conf: search, nameservers, options.
func (rv resolver) render() []byte {
	var b strings.Builder
	if len(rv.Searches) > 0 {
		b.WriteString("search " + strings.Join(rv.Searches, " ") + "\n")
	}
	for _, s := range rv.Servers {
		b.WriteString("nameserver " + s + "\n")
	}
	if len(rv.Options) > 0 {
		b.WriteString("options " + strings.Join(rv.Options, " ") + "\n")
	}
	return []byte(b.String())
}

// dnsKind is what a pod's dnsPolicy comes to.
type dnsKind int

const (
	dnsCluster dnsKind = iota
	dnsHost
	dnsNone
)

// podDNSKind is kubelet's reading of dnsPolicy: ClusterFirst means the host's resolver for a
// hostNetwork pod (those must ask for ClusterFirstWithHostNet). Admission refuses other values; an
// unknown one (a pod stored by an older mqlet) is taken as ClusterFirst, as kubelet does.
func podDNSKind(pod *v1.Pod) dnsKind {
	switch pod.Spec.DNSPolicy {
	case v1.DNSNone:
		return dnsNone
	case v1.DNSDefault:
		return dnsHost
	case v1.DNSClusterFirst, "":
		if pod.Spec.HostNetwork {
			return dnsHost
		}
	}
	return dnsCluster
}

// podResolver is the resolver of pod, from the node's settings and the host's resolver file
// (already read: unused for dnsPolicy None). The warnings are kubelet's events for a ClusterFirst
// pod on a node without cluster DNS and for a resolver cut to the limits.
func podResolver(pod *v1.Pod, dns DNS, host resolver) (resolver, []SandboxWarning) {
	var rv resolver
	var warns []SandboxWarning
	kind := podDNSKind(pod)
	if kind == dnsCluster && len(dns.ClusterDNS) == 0 {
		warns = append(warns, SandboxWarning{ReasonMissingClusterDNS, fmt.Sprintf(
			"pod %s/%s: the node has no cluster DNS server configured (clusterDNS), so dnsPolicy %s cannot be honoured; using the host's resolver as with dnsPolicy %s",
			pod.Namespace, pod.Name, pod.Spec.DNSPolicy, v1.DNSDefault)})
		kind = dnsHost
	}
	switch kind {
	case dnsCluster:
		// The cluster's servers alone: they forward what they cannot answer themselves.
		rv.Servers = slices.Clone(dns.ClusterDNS)
		rv.Searches = host.Searches
		if d := dns.ClusterDomain; d != "" {
			rv.Searches = append([]string{pod.Namespace + ".svc." + d, "svc." + d, d}, host.Searches...)
		}
		rv.Searches = unique(rv.Searches)
		rv.Options = []string{clusterFirstNdots}
	case dnsHost:
		if dns.ResolvConf == "" {
			// No host resolver file: ask the local resolver only, and search nothing. kubelet does
			// the same, so that a missing file never means the runtime's own default.
			rv = resolver{Servers: []string{"127.0.0.1"}, Searches: []string{"."}}
		} else {
			rv = resolver{Servers: slices.Clone(host.Servers), Searches: slices.Clone(host.Searches), Options: slices.Clone(host.Options)}
		}
	}
	if c := pod.Spec.DNSConfig; c != nil {
		rv.Servers = unique(append(rv.Servers, c.Nameservers...))
		rv.Searches = unique(append(rv.Searches, c.Searches...))
		rv.Options = mergeOptions(rv.Options, c.Options)
	}
	rv, msgs := fitLimits(rv)
	for _, m := range msgs {
		warns = append(warns, SandboxWarning{ReasonDNSConfigForming, fmt.Sprintf("pod %s/%s: %s", pod.Namespace, pod.Name, m)})
	}
	return rv, warns
}

// unique keeps the first of each value, in order.
func unique(s []string) []string {
	seen := make(map[string]bool, len(s))
	out := s[:0:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// mergeOptions lays the pod's dnsConfig options over base: an option of the same name takes the
// pod's value (or none), in base's place; new ones follow in the pod's order. kubelet merges the
// same way but in map order; a stable order keeps the file from changing when nothing did.
func mergeOptions(base []string, pod []v1.PodDNSConfigOption) []string {
	name := func(o string) string { n, _, _ := strings.Cut(o, ":"); return n }
	out := slices.Clone(base)
	for _, o := range pod {
		opt := o.Name
		if o.Value != nil && *o.Value != "" {
			opt += ":" + *o.Value
		}
		if i := slices.IndexFunc(out, func(b string) bool { return name(b) == o.Name }); i >= 0 {
			out[i] = opt
			// A name given twice in base (from the host file) keeps only the pod's value.
			out = append(out[:i+1], slices.DeleteFunc(out[i+1:], func(b string) bool { return name(b) == o.Name })...)
		} else {
			out = append(out, opt)
		}
	}
	return out
}

// fitLimits cuts rv to what resolvers read, as kubelet does, and says what was cut. A pod's own
// dnsConfig beyond the limits is refused at admission; what is cut here comes from the host file
// or the cluster settings combined with it.
func fitLimits(rv resolver) (resolver, []string) {
	var msgs []string
	if len(rv.Servers) > maxNameservers {
		rv.Servers = rv.Servers[:maxNameservers]
		msgs = append(msgs, fmt.Sprintf("more than %d nameservers; using only %s", maxNameservers, strings.Join(rv.Servers, " ")))
	}
	cut := false
	if len(rv.Searches) > maxSearches {
		rv.Searches, cut = rv.Searches[:maxSearches], true
	}
	kept := rv.Searches[:0:0]
	for _, s := range rv.Searches {
		if len(s) > maxSearchDomainChars {
			cut = true
			continue
		}
		kept = append(kept, s)
	}
	for len(kept) > 0 && len(strings.Join(kept, " ")) > maxSearchListChars {
		kept, cut = kept[:len(kept)-1], true
	}
	rv.Searches = kept
	if cut {
		msgs = append(msgs, fmt.Sprintf("search list longer than %d domains or %d characters, or with a domain longer than %d characters; using only %q",
			maxSearches, maxSearchListChars, maxSearchDomainChars, strings.Join(kept, " ")))
	}
	return rv, msgs
}

// podDomain is the pod's DNS domain with a subdomain: <subdomain>.<namespace>.svc.<clusterDomain>.
func podDomain(pod *v1.Pod, clusterDomain string) string {
	if pod.Spec.Subdomain == "" {
		return ""
	}
	return pod.Spec.Subdomain + "." + pod.Namespace + ".svc." + clusterDomain
}

// kernelHostname is the hostname the pod's UTS namespace gets: its hostname, or with
// setHostnameAsFQDN and a subdomain its FQDN, which must fit the kernel's 64 characters.
func kernelHostname(pod *v1.Pod, domain string) (string, error) {
	h := ctrspec.PodHostname(pod)
	if fqdn := pod.Spec.SetHostnameAsFQDN; fqdn == nil || !*fqdn || domain == "" {
		return h, nil
	}
	h += "." + domain
	if len(h) > maxHostnameChars {
		return "", ctrspec.ConfigErrorf("pod %s/%s: setHostnameAsFQDN: the FQDN %s has %d characters, more than the kernel's %d", pod.Namespace, pod.Name, h, len(h), maxHostnameChars)
	}
	return h, nil
}

// managedHosts is kubelet's hosts file of a pod with its own network: localhost lines, one line per
// pod IP naming the pod (its FQDN first when it has a domain), then the pod's hostAliases.
func managedHosts(podIPs []string, hostname, domain string, aliases []v1.HostAlias) []byte {
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file.\n" +
		"127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\n" +
		"fe00::0\tip6-mcastprefix\n" +
		"fe00::1\tip6-allnodes\n" +
		"fe00::2\tip6-allrouters\n")
	for _, ip := range podIPs {
		if domain != "" {
			fmt.Fprintf(&b, "%s\t%s.%s\t%s\n", ip, hostname, domain, hostname)
		} else {
			fmt.Fprintf(&b, "%s\t%s\n", ip, hostname)
		}
	}
	b.WriteString(aliasLines(aliases))
	return []byte(b.String())
}

// hostNetworkHosts is kubelet's hosts file of a hostNetwork pod: the host's, then the hostAliases.
func hostNetworkHosts(host []byte, aliases []v1.HostAlias) []byte {
	out := append([]byte("# Kubernetes-managed hosts file (host network).\n"), host...)
	return append(out, aliasLines(aliases)...)
}

func aliasLines(aliases []v1.HostAlias) string {
	if len(aliases) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n# Entries added by HostAliases.\n")
	for _, a := range aliases {
		b.WriteString(a.IP + "\t" + strings.Join(a.Hostnames, "\t") + "\n")
	}
	return b.String()
}

// checkFileInput refuses what would break the files' line format. Admission already checks these
// fields more strictly; this guards pods stored before it did, since the files are read by every
// resolver in the pod.
func checkFileInput(pod *v1.Pod, podIPs []string) error {
	bad := func(field, v string) error {
		return ctrspec.ConfigErrorf("pod %s/%s: %s %q cannot be written to the pod's hosts or resolv.conf file", pod.Namespace, pod.Name, field, v)
	}
	token := func(s string) bool {
		return s != "" && !strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '#' || r == ';' })
	}
	ip := func(s string) bool { return net.ParseIP(s) != nil } // no zones: "%..." may hold anything
	s := &pod.Spec
	for _, f := range []struct{ name, v string }{{"spec.hostname", s.Hostname}, {"spec.subdomain", s.Subdomain}} {
		if f.v != "" && len(validation.IsDNS1123Label(f.v)) > 0 {
			return bad(f.name, f.v)
		}
	}
	for _, p := range podIPs {
		if !ip(p) {
			return bad("pod IP", p)
		}
	}
	for i, a := range s.HostAliases {
		if !ip(a.IP) {
			return bad(fmt.Sprintf("spec.hostAliases[%d].ip", i), a.IP)
		}
		for j, h := range a.Hostnames {
			if !token(h) {
				return bad(fmt.Sprintf("spec.hostAliases[%d].hostnames[%d]", i, j), h)
			}
		}
	}
	if c := s.DNSConfig; c != nil {
		for i, n := range c.Nameservers {
			if !ip(n) {
				return bad(fmt.Sprintf("spec.dnsConfig.nameservers[%d]", i), n)
			}
		}
		for i, v := range c.Searches {
			if !token(v) {
				return bad(fmt.Sprintf("spec.dnsConfig.searches[%d]", i), v)
			}
		}
		for i, o := range c.Options {
			if !token(o.Name) || o.Value != nil && *o.Value != "" && !token(*o.Value) {
				return bad(fmt.Sprintf("spec.dnsConfig.options[%d]", i), o.Name)
			}
		}
	}
	return nil
}

// hostsHook writes the pod's hosts, resolv.conf and hostname files in the pod dir. It runs after the
// network hooks, which fill the pod's IPs. It runs again after an agent restart and for a new spec:
// a file is rewritten only when its content differs, and then in place, so the pod's running
// containers (whose mounts hold the file, not its name) see the new hostAliases or dnsConfig at
// their next lookup, as they do when kubelet rewrites its hosts file.
type hostsHook struct{ dns DNS }

func (hostsHook) Name() string { return "hosts, resolv.conf and hostname" }

func (h hostsHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	if err := checkFileInput(pod, sb.PodIPs); err != nil {
		return err
	}
	dns := h.dns
	var hosts []byte
	var hostname string
	if pod.Spec.HostNetwork {
		host, err := os.ReadFile(hostHostsFile)
		if err != nil {
			return fmt.Errorf("host's hosts file for a hostNetwork pod: %w", err)
		}
		hosts = hostNetworkHosts(host, pod.Spec.HostAliases)
		if hostname, err = os.Hostname(); err != nil {
			return fmt.Errorf("host's hostname for a hostNetwork pod: %w", err)
		}
	} else {
		domain := podDomain(pod, dns.ClusterDomain)
		hosts = managedHosts(sb.PodIPs, ctrspec.PodHostname(pod), domain, pod.Spec.HostAliases)
		var err error
		if hostname, err = kernelHostname(pod, domain); err != nil {
			return err
		}
	}
	var host resolver
	if podDNSKind(pod) != dnsNone && dns.ResolvConf != "" {
		b, err := os.ReadFile(dns.ResolvConf)
		if err != nil {
			return fmt.Errorf("host resolver file (resolvConf): %w", err)
		}
		host = parseResolvConf(b)
	}
	rv, warns := podResolver(pod, dns, host)

	files := []struct {
		dst     *string
		name    string
		content []byte
	}{
		{&sb.HostsFile, "hosts", hosts},
		{&sb.ResolvConf, "resolv.conf", rv.render()},
		{&sb.HostnameFile, "hostname", []byte(hostname + "\n")},
	}
	for _, f := range files {
		p := filepath.Join(sb.Dir, f.name)
		written, err := syncFile(p, f.content)
		if err != nil {
			return err
		}
		// The warnings go with a resolv.conf that is new or changed, not with every agent restart.
		if f.name == "resolv.conf" && written {
			sb.Warnings = append(sb.Warnings, warns...)
		}
		*f.dst = p
	}
	sb.Hostname = hostname
	return nil
}

// syncFile makes the file at p hold content: written afresh when missing, in place when different
// (see hostsHook), untouched when the same. It reports whether it wrote.
func syncFile(p string, content []byte) (bool, error) {
	old, err := os.ReadFile(p)
	switch {
	case err == nil && string(old) == string(content):
		return false, nil
	case errors.Is(err, os.ErrNotExist):
		return true, atomicfile.Write(p, content, 0o644)
	case err != nil:
		return false, err
	}
	return true, os.WriteFile(p, content, 0o644)
}

// podFileMounts mounts the pod's hosts, resolv.conf and hostname files into container c, except
// where c mounts a volume of its own (kubelet and the CRI leave those alone). /etc/hosts is
// writable as kubelet mounts it; resolv.conf and hostname are read-only with a read-only root
// filesystem, as the CRI mounts them.
func podFileMounts(pod *v1.Pod, sb *Sandbox, c *v1.Container) (oci.SpecOpts, error) {
	if sb.HostsFile == "" || sb.ResolvConf == "" || sb.HostnameFile == "" {
		return nil, fmt.Errorf("pod %s/%s: the sandbox has no hosts, resolv.conf or hostname file", pod.Namespace, pod.Name)
	}
	ro := "rw"
	if sc := c.SecurityContext; sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		ro = "ro"
	}
	var mounts []specs.Mount
	for _, f := range []struct{ dst, src, mode string }{
		{etcHosts, sb.HostsFile, "rw"},
		{etcResolvConf, sb.ResolvConf, ro},
		{etcHostname, sb.HostnameFile, ro},
	} {
		if slices.ContainsFunc(c.VolumeMounts, func(m v1.VolumeMount) bool { return path.Clean(m.MountPath) == f.dst }) {
			continue
		}
		mounts = append(mounts, specs.Mount{Destination: f.dst, Type: "bind", Source: f.src, Options: []string{"rbind", f.mode}})
	}
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		// Ours replace any the default spec or an earlier option put there.
		s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool {
			return slices.ContainsFunc(mounts, func(o specs.Mount) bool { return o.Destination == m.Destination })
		})
		s.Mounts = append(s.Mounts, mounts...)
		return nil
	}, nil
}
