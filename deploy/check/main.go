// Strictly decodes Kubernetes manifests into the API's Go types (unknown or
// mistyped fields are errors), for machines where kubeconform cannot fetch schemas.
package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

func main() {
	failed := false
	for _, file := range os.Args[1:] {
		data, err := os.ReadFile(file)
		if err != nil {
			fmt.Println(err)
			os.Exit(2)
		}
		for i, doc := range bytes.Split(data, []byte("\n---\n")) {
			if len(strings.TrimSpace(string(doc))) == 0 {
				continue
			}
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				fmt.Printf("%s #%d: %v\n", file, i, err)
				failed = true
				continue
			}
			var obj interface{}
			switch meta.APIVersion + "/" + meta.Kind {
			case "v1/Service":
				obj = &corev1.Service{}
			case "apps/v1/Deployment":
				obj = &appsv1.Deployment{}
			case "apps/v1/StatefulSet":
				obj = &appsv1.StatefulSet{}
			case "policy/v1/PodDisruptionBudget":
				obj = &policyv1.PodDisruptionBudget{}
			case "networking.k8s.io/v1/NetworkPolicy":
				obj = &networkingv1.NetworkPolicy{}
			default:
				fmt.Printf("%s #%d: unknown kind %s %s\n", file, i, meta.APIVersion, meta.Kind)
				failed = true
				continue
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				fmt.Printf("%s #%d %s: %v\n", file, i, meta.Kind, err)
				failed = true
				continue
			}
			fmt.Printf("%s #%d %s: ok\n", file, i, meta.Kind)
		}
	}
	if failed {
		os.Exit(1)
	}
}
