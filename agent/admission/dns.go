package admission

import (
	"fmt"
	"net"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The resolver's limits as the API server enforces them on dnsConfig (glibc reads 3 nameservers;
// the search list limits are the "expanded" ones of every current Kubernetes). The runtime cuts what
// the host's resolver file adds beyond them, as kubelet does.
const (
	maxDNSNameservers     = 3
	maxDNSSearches        = 32
	maxDNSSearchListChars = 2048
)

var dnsPolicies = []v1.DNSPolicy{v1.DNSClusterFirstWithHostNet, v1.DNSClusterFirst, v1.DNSDefault, v1.DNSNone}

// validateDNS checks what becomes the pod's resolv.conf, hosts file and hostname: the API server's
// rules for dnsPolicy, dnsConfig, hostname, subdomain and hostAliases, plus option names and values
// that would break the resolv.conf line they are written on.
func validateDNS(spec *v1.PodSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	policy := path.Child("dnsPolicy")
	switch spec.DNSPolicy {
	case v1.DNSClusterFirstWithHostNet, v1.DNSClusterFirst, v1.DNSDefault, v1.DNSNone:
	case "":
		errs = append(errs, field.Required(policy, ""))
	default:
		errs = append(errs, field.NotSupported(policy, spec.DNSPolicy, dnsPolicies))
	}
	for _, f := range []struct{ name, v string }{{"hostname", spec.Hostname}, {"subdomain", spec.Subdomain}} {
		if f.v == "" {
			continue
		}
		for _, msg := range validation.IsDNS1123Label(f.v) {
			errs = append(errs, field.Invalid(path.Child(f.name), f.v, msg))
		}
	}
	errs = append(errs, validateHostAliases(spec.HostAliases, path.Child("hostAliases"))...)

	cfgPath := path.Child("dnsConfig")
	cfg := spec.DNSConfig
	if spec.DNSPolicy == v1.DNSNone {
		if cfg == nil {
			return append(errs, field.Required(cfgPath, fmt.Sprintf("must be given when dnsPolicy is %s", v1.DNSNone)))
		}
		if len(cfg.Nameservers) == 0 {
			errs = append(errs, field.Required(cfgPath.Child("nameservers"), fmt.Sprintf("at least one nameserver is needed when dnsPolicy is %s", v1.DNSNone)))
		}
	}
	if cfg == nil {
		return errs
	}
	ns := cfgPath.Child("nameservers")
	if len(cfg.Nameservers) > maxDNSNameservers {
		errs = append(errs, field.TooMany(ns, len(cfg.Nameservers), maxDNSNameservers))
	}
	for i, s := range cfg.Nameservers {
		if net.ParseIP(s) == nil {
			errs = append(errs, field.Invalid(ns.Index(i), s, "must be an IP address"))
		}
	}
	searches := cfgPath.Child("searches")
	if len(cfg.Searches) > maxDNSSearches {
		errs = append(errs, field.TooMany(searches, len(cfg.Searches), maxDNSSearches))
	}
	if n := len(strings.Join(cfg.Searches, " ")); n > maxDNSSearchListChars {
		errs = append(errs, field.Invalid(searches, fmt.Sprintf("%d characters", n),
			fmt.Sprintf("the search list must not have more than %d characters, spaces between domains included", maxDNSSearchListChars)))
	}
	for i, s := range cfg.Searches {
		// A trailing dot (an absolute name) is fine.
		for _, msg := range validation.IsDNS1123Subdomain(strings.TrimSuffix(s, ".")) {
			errs = append(errs, field.Invalid(searches.Index(i), s, msg))
		}
	}
	for i, o := range cfg.Options {
		p := cfgPath.Child("options").Index(i)
		switch {
		case o.Name == "":
			errs = append(errs, field.Required(p.Child("name"), ""))
		case !resolvToken(o.Name) || strings.Contains(o.Name, ":"):
			errs = append(errs, field.Invalid(p.Child("name"), o.Name, "must be a resolver option name such as ndots or edns0: no spaces, ':', '#' or ';'"))
		}
		if o.Value != nil && *o.Value != "" && !resolvToken(*o.Value) {
			errs = append(errs, field.Invalid(p.Child("value"), *o.Value, "must not contain spaces, '#' or ';'"))
		}
	}
	return errs
}

// resolvToken is one word of a resolv.conf line.
func resolvToken(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '#' || r == ';' })
}

// validateHostAliases is the API server's rule: an IP address and DNS-1123 subdomains.
func validateHostAliases(aliases []v1.HostAlias, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, a := range aliases {
		p := path.Index(i)
		if net.ParseIP(a.IP) == nil {
			errs = append(errs, field.Invalid(p.Child("ip"), a.IP, "must be an IP address"))
		}
		for j, h := range a.Hostnames {
			for _, msg := range validation.IsDNS1123Subdomain(h) {
				errs = append(errs, field.Invalid(p.Child("hostnames").Index(j), h, msg))
			}
		}
	}
	return errs
}
