package admission

import (
	"fmt"
	"strings"
	"testing"
)

// dnsYAML is a pod manifest with extra spec lines (two-space indented under spec).
func dnsYAML(spec string) string {
	return podYAML("web", "busybox:1.36") + spec
}

func TestDNSValidation(t *testing.T) {
	var searches33, long []string
	for i := 0; i < 33; i++ {
		searches33 = append(searches33, fmt.Sprintf("d%d.example", i))
	}
	for i := 0; i < 12; i++ {
		long = append(long, strings.Repeat(string(rune('a'+i)), 60)+"."+strings.Repeat("x", 60)+"."+strings.Repeat("y", 60)+".example") // 12 x 190 + 11 spaces
	}
	list := func(s []string) string { return "[" + strings.Join(s, ", ") + "]" }
	cases := []struct {
		name, spec string
		want       []string
	}{
		{"unknown dnsPolicy", "  dnsPolicy: ClusterLast\n", []string{`spec.dnsPolicy: Unsupported value: "ClusterLast"`}},
		{"None without dnsConfig", "  dnsPolicy: None\n", []string{"spec.dnsConfig: Required value: must be given when dnsPolicy is None"}},
		{"None without nameservers", "  dnsPolicy: None\n  dnsConfig:\n    searches: [a.example]\n",
			[]string{"spec.dnsConfig.nameservers: Required value: at least one nameserver"}},
		{"four nameservers", "  dnsConfig:\n    nameservers: [1.1.1.1, 1.0.0.1, 8.8.8.8, 9.9.9.9]\n",
			[]string{"spec.dnsConfig.nameservers: Too many: 4: must have at most 3 items"}},
		{"nameserver not an IP", "  dnsConfig:\n    nameservers: [dns.example]\n",
			[]string{`spec.dnsConfig.nameservers[0]: Invalid value: "dns.example": must be an IP address`}},
		{"nameserver with a zone", "  dnsConfig:\n    nameservers: [\"fe80::1%eth0\"]\n",
			[]string{`spec.dnsConfig.nameservers[0]: Invalid value`}},
		{"33 searches", "  dnsConfig:\n    searches: " + list(searches33) + "\n",
			[]string{"spec.dnsConfig.searches: Too many: 33: must have at most 32 items"}},
		{"search list too long", "  dnsConfig:\n    searches: " + list(long) + "\n",
			[]string{"spec.dnsConfig.searches: Invalid value: \"2291 characters\"", "more than 2048"}},
		{"bad search", "  dnsConfig:\n    searches: [Bad_Domain]\n", []string{`spec.dnsConfig.searches[0]: Invalid value: "Bad_Domain"`}},
		{"option without a name", "  dnsConfig:\n    options: [{value: \"2\"}]\n", []string{"spec.dnsConfig.options[0].name: Required value"}},
		{"option name with a colon", "  dnsConfig:\n    options: [{name: \"ndots:2\"}]\n", []string{`spec.dnsConfig.options[0].name: Invalid value: "ndots:2"`}},
		{"option value with a space", "  dnsConfig:\n    options: [{name: ndots, value: \"2 rotate\"}]\n", []string{`spec.dnsConfig.options[0].value: Invalid value: "2 rotate"`}},
		{"hostname", "  hostname: Web_0\n", []string{`spec.hostname: Invalid value: "Web_0"`}},
		{"subdomain", "  subdomain: a.b\n", []string{`spec.subdomain: Invalid value: "a.b"`}},
		{"hostAlias IP", "  hostAliases: [{ip: db, hostnames: [db.local]}]\n", []string{`spec.hostAliases[0].ip: Invalid value: "db": must be an IP address`}},
		{"hostAlias hostname", "  hostAliases: [{ip: 10.0.0.5, hostnames: [ok, \"no way\"]}]\n", []string{`spec.hostAliases[0].hostnames[1]: Invalid value: "no way"`}},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			err := parseProblem(t, dnsYAML(tt.spec))
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

func TestDNSValid(t *testing.T) {
	var searches32 []string
	for i := 0; i < 32; i++ {
		searches32 = append(searches32, fmt.Sprintf("d%d.example", i))
	}
	for name, spec := range map[string]string{
		"None with dnsConfig": "  dnsPolicy: None\n  dnsConfig:\n    nameservers: [1.1.1.1, \"2606:4700::1111\", 8.8.8.8]\n" +
			"    searches: [\"corp.example.\", lab.example]\n    options: [{name: ndots, value: \"2\"}, {name: edns0}]\n",
		"32 searches":             "  dnsConfig:\n    searches: [" + strings.Join(searches32, ", ") + "]\n",
		"ClusterFirstWithHostNet": "  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n",
		"Default":                 "  dnsPolicy: Default\n",
		"names and aliases":       "  hostname: web-0\n  subdomain: api\n  setHostnameAsFQDN: true\n  hostAliases: [{ip: 10.0.0.5, hostnames: [db, db.local]}, {ip: \"fd00::5\", hostnames: [db6]}]\n",
	} {
		if _, err := admit("/m/p.yaml", dnsYAML(spec)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The API server's default.
	if p := parseOne(t, "/m/p.yaml", dnsYAML("")); p.Spec.DNSPolicy != "ClusterFirst" {
		t.Errorf("default dnsPolicy = %q", p.Spec.DNSPolicy)
	}
}
