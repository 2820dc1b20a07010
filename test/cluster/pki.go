package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

const certValidity = 10 * 365 * 24 * time.Hour

// CA is a certificate authority whose key is in memory.
type CA struct {
	Cert     *x509.Certificate
	Key      crypto.Signer
	CertFile string
}

// KeyPair names the files of an issued certificate.
type KeyPair struct {
	CertFile, KeyFile string
}

// PKI holds everything a local control plane needs, written under Dir.
type PKI struct {
	Dir        string
	CA         *CA
	FrontProxy *CA
	// APIServer serves the kube-apiserver's TLS.
	APIServer KeyPair
	// APIServerKubeletClient is the apiserver's identity towards kubelets.
	APIServerKubeletClient KeyPair
	// FrontProxyClient is the apiserver's identity towards aggregated apiservers.
	FrontProxyClient KeyPair
	// ServiceAccountKey and ServiceAccountPub sign and verify service account tokens.
	ServiceAccountKey, ServiceAccountPub string
}

// NewPKI creates the CAs, serving certificates and service account keys in dir.
func NewPKI(dir string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	p := &PKI{Dir: dir}
	var err error
	if p.CA, err = newCA(dir, "ca", "gputopo-localcluster-ca"); err != nil {
		return nil, err
	}
	if p.FrontProxy, err = newCA(dir, "front-proxy-ca", "gputopo-localcluster-front-proxy-ca"); err != nil {
		return nil, err
	}
	p.APIServer, err = p.CA.Issue(dir, "apiserver", CertRequest{
		CommonName: "kube-apiserver",
		DNSNames:   []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPs:        []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(serviceIP)},
		Server:     true,
	})
	if err != nil {
		return nil, err
	}
	p.APIServerKubeletClient, err = p.CA.Issue(dir, "apiserver-kubelet-client", CertRequest{
		CommonName: "kube-apiserver-kubelet-client", Organizations: []string{"system:masters"},
	})
	if err != nil {
		return nil, err
	}
	p.FrontProxyClient, err = p.FrontProxy.Issue(dir, "front-proxy-client", CertRequest{CommonName: "front-proxy-client"})
	if err != nil {
		return nil, err
	}
	if err := p.writeServiceAccountKeys(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *PKI) writeServiceAccountKeys() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate service account key: %w", err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return fmt.Errorf("encode service account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("encode service account public key: %w", err)
	}
	p.ServiceAccountKey = filepath.Join(p.Dir, "sa.key")
	p.ServiceAccountPub = filepath.Join(p.Dir, "sa.pub")
	if err := keyutil.WriteKey(p.ServiceAccountKey, keyPEM); err != nil {
		return fmt.Errorf("write service account key: %w", err)
	}
	if err := os.WriteFile(p.ServiceAccountPub, pemEncode("PUBLIC KEY", pubDER), 0o644); err != nil {
		return fmt.Errorf("write service account public key: %w", err)
	}
	return nil
}

// IssueKubeconfig issues a client certificate for user in groups and writes a
// kubeconfig for it, with the certificates embedded, to path.
func (p *PKI) IssueKubeconfig(path, server, user string, groups ...string) error {
	name := filepath.Base(path)
	kp, err := p.CA.Issue(p.Dir, "client-"+name, CertRequest{CommonName: user, Organizations: groups})
	if err != nil {
		return err
	}
	return WriteKubeconfig(path, server, p.CA.CertFile, kp)
}

// WriteKubeconfig writes a kubeconfig with embedded certificates.
func WriteKubeconfig(path, server, caFile string, kp KeyPair) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("read CA for kubeconfig %s: %w", path, err)
	}
	crt, err := os.ReadFile(kp.CertFile)
	if err != nil {
		return fmt.Errorf("read certificate for kubeconfig %s: %w", path, err)
	}
	key, err := os.ReadFile(kp.KeyFile)
	if err != nil {
		return fmt.Errorf("read key for kubeconfig %s: %w", path, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: crt, ClientKeyData: key}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "user"}
	cfg.CurrentContext = "local"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// CertRequest describes a certificate to issue.
type CertRequest struct {
	CommonName    string
	Organizations []string
	DNSNames      []string
	IPs           []net.IP
	// Server makes a serving certificate; otherwise it is a client certificate.
	Server bool
}

func newCA(dir, name, cn string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key for CA %s: %w", name, err)
	}
	cert, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: cn}, key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA %s: %w", name, err)
	}
	ca := &CA{Cert: cert, Key: key, CertFile: filepath.Join(dir, name+".crt")}
	if err := writeKeyPair(dir, name, cert, key); err != nil {
		return nil, err
	}
	return ca, nil
}

// Issue signs a new certificate and writes NAME.crt and NAME.key into dir.
func (ca *CA) Issue(dir, name string, req CertRequest) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("generate key for %s: %w", name, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return KeyPair{}, fmt.Errorf("pick serial for %s: %w", name, err)
	}
	usage := x509.ExtKeyUsageClientAuth
	if req.Server {
		usage = x509.ExtKeyUsageServerAuth
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: req.Organizations},
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPs,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("sign certificate %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return KeyPair{}, fmt.Errorf("parse certificate %s: %w", name, err)
	}
	if err := writeKeyPair(dir, name, cert, key); err != nil {
		return KeyPair{}, err
	}
	return KeyPair{CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key")}, nil
}

func writeKeyPair(dir, name string, cert *x509.Certificate, key crypto.Signer) error {
	certPEM, err := certutil.EncodeCertificates(cert)
	if err != nil {
		return fmt.Errorf("encode certificate %s: %w", name, err)
	}
	if err := certutil.WriteCert(filepath.Join(dir, name+".crt"), certPEM); err != nil {
		return fmt.Errorf("write certificate %s: %w", name, err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return fmt.Errorf("encode key %s: %w", name, err)
	}
	if err := keyutil.WriteKey(filepath.Join(dir, name+".key"), keyPEM); err != nil {
		return fmt.Errorf("write key %s: %w", name, err)
	}
	return nil
}

func pemEncode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
