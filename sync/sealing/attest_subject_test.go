package sealing

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testpki"
)

// Which CN is "the" CN. Go's pkix.Name keeps the last CommonName of a subject,
// mosquitto's use_identity_as_username takes the first (X509_NAME_get_index_by_NID(..., -1)). A
// certificate whose subject is CN=edge-2, CN=edge-1 logs in to the broker as edge-2 (confined to
// edge-2's subtree) and vouches, for writers, for edge-1's sealing key. It takes a CA that signs
// such a subject (one that copies a CSR's subject as it is); then the holder of edge-2 and the
// broker read edge-1's Secrets.
func TestAttestedRefusesTwoCommonNames(t *testing.T) {
	ca := testpki.NewCA(t)
	cn := asn1.ObjectIdentifier{2, 5, 4, 3}
	cert := ca.Issue(t, testpki.Cert{Subject: pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{{Type: cn, Value: "edge-2"}, {Type: cn, Value: "edge-1"}}}})
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	k, _ := Generate()
	_, err = trust(t, ca.Pool).Attested(attestedNode(t, "edge-1", k, cert), time.Now())
	if err != nil && !strings.Contains(err.Error(), "2 CNs") {
		t.Errorf("Attested = %v, want a refusal naming the two CNs", err)
	}
	if err == nil {
		var cns []any
		for _, atv := range leaf.Subject.Names {
			if atv.Type.Equal(cn) {
				cns = append(cns, atv.Value)
			}
		}
		t.Errorf("broke: a certificate whose subject has the CNs %v (mosquitto's identity: the first) vouches for edge-1's sealing key (Go reads CN %q)", cns, leaf.Subject.CommonName)
	}
}
