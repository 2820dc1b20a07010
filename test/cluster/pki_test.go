package cluster

import (
	"crypto/x509"
	"net"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/tools/clientcmd"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

func TestPKI(t *testing.T) {
	dir := t.TempDir()
	p, err := NewPKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.CA.Cert)
	if !p.CA.Cert.IsCA {
		t.Error("CA certificate is not a CA")
	}

	serving := loadCert(t, p.APIServer.CertFile)
	for _, host := range []string{"127.0.0.1", "localhost", "kubernetes.default.svc", serviceIP} {
		if _, err := serving.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("apiserver certificate for %s: %v", host, err)
		}
	}
	if diff := cmp.Diff([]net.IP{net.ParseIP("127.0.0.1").To4(), net.ParseIP(serviceIP).To4()}, serving.IPAddresses); diff != "" {
		t.Errorf("apiserver IP SANs (-want +got):\n%s", diff)
	}

	fpRoots := x509.NewCertPool()
	fpRoots.AddCert(p.FrontProxy.Cert)
	if _, err := loadCert(t, p.FrontProxyClient.CertFile).Verify(x509.VerifyOptions{Roots: fpRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("front proxy client certificate: %v", err)
	}
	if _, err := keyutil.PrivateKeyFromFile(p.ServiceAccountKey); err != nil {
		t.Errorf("service account key: %v", err)
	}
	if keys, err := keyutil.PublicKeysFromFile(p.ServiceAccountPub); err != nil || len(keys) != 1 {
		t.Errorf("service account public key: %v (%d keys)", err, len(keys))
	}

	kubeconfig := filepath.Join(dir, "node.kubeconfig")
	if err := p.IssueKubeconfig(kubeconfig, "https://127.0.0.1:6443", "system:node:n1", "system:nodes"); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:6443" {
		t.Errorf("kubeconfig server = %q", cfg.Host)
	}
	certs, err := certutil.ParseCertsPEM(cfg.CertData)
	if err != nil {
		t.Fatal(err)
	}
	client := certs[0]
	if _, err := client.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if diff := cmp.Diff([]string{"system:nodes"}, client.Subject.Organization); diff != "" || client.Subject.CommonName != "system:node:n1" {
		t.Errorf("client subject = %v", client.Subject)
	}
}

func loadCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	certs, err := certutil.CertsFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return certs[0]
}
