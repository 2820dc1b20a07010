package command

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestClientContentType(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	const cfg = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ in, content, accept string }{
		{"", "", ""},
		{ContentTypeJSON, "", ""},
		{ContentTypeProtobuf, ContentTypeProtobuf, ContentTypeProtobuf + "," + ContentTypeJSON},
	} {
		c, err := restConfig(kubeconfig, ClientOptions{ContentType: tc.in})
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if c.ContentType != tc.content || c.AcceptContentTypes != tc.accept {
			t.Errorf("%q: content type %q, accept %q; want %q, %q", tc.in, c.ContentType, c.AcceptContentTypes, tc.content, tc.accept)
		}
	}
	if _, err := restConfig(kubeconfig, ClientOptions{ContentType: "yaml"}); err == nil || !strings.Contains(err.Error(), ContentTypeProtobuf) {
		t.Errorf("content type yaml: %v, want an error naming the choices", err)
	}
}
