package org.cobalt.peers;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;

import org.eclipse.californium.core.CoapClient;
import org.eclipse.californium.core.CoapResponse;
import org.eclipse.californium.core.config.CoapConfig;
import org.eclipse.californium.core.network.CoapEndpoint;
import org.eclipse.californium.elements.config.Configuration;
import org.eclipse.californium.elements.config.UdpConfig;
import org.eclipse.californium.scandium.DTLSConnector;
import org.eclipse.californium.scandium.config.DtlsConfig;
import org.eclipse.californium.scandium.config.DtlsConnectorConfig;
import org.eclipse.californium.scandium.dtls.cipher.CipherSuite;
import org.eclipse.californium.scandium.dtls.pskstore.AdvancedSinglePskStore;

/**
 * Californium's Scandium as a DTLS client with a Connection ID (RFC 9146): GETs a
 * coaps URI several times over one session, pausing between requests (so that a
 * loopback "NAT" in the test can give it a new source port meanwhile). Every line
 * it prints on stdout is one event, {@code WORD key=value ...}.
 *
 * <pre>
 * CidClient URI IDENTITY KEY COUNT PAUSE_MS [OWN_CID_LEN]
 *     RESPONSE n=I code=C payload=TEXT for each request (code=none without answer),
 *     then DONE ok=N
 * </pre>
 *
 * OWN_CID_LEN (default 0) is the length of the CID the client asks the server to
 * use towards it; with 0 it supports CID but receives records without one.
 */
public final class CidClient {

	private CidClient() {
	}

	public static void main(String[] args) throws Exception {
		if (args.length < 5) {
			System.err.println("usage: CidClient URI IDENTITY KEY COUNT PAUSE_MS [OWN_CID_LEN]");
			System.exit(2);
		}
		DtlsConfig.register();
		CoapConfig.register();
		UdpConfig.register();
		String uri = args[0];
		String identity = args[1];
		byte[] key = args[2].getBytes(StandardCharsets.UTF_8);
		int count = Integer.parseInt(args[3]);
		long pauseMs = Long.parseLong(args[4]);
		int ownCidLength = args.length > 5 ? Integer.parseInt(args[5]) : 0;

		Configuration config = Configuration.createStandardWithoutFile();
		config.set(DtlsConfig.DTLS_ROLE, DtlsConfig.DtlsRole.CLIENT_ONLY);
		config.set(DtlsConfig.DTLS_CONNECTION_ID_LENGTH, ownCidLength);
		config.set(DtlsConfig.DTLS_RECOMMENDED_CIPHER_SUITES_ONLY, false);
		config.set(DtlsConfig.DTLS_CIPHER_SUITES, List.of(CipherSuite.TLS_PSK_WITH_AES_128_CCM_8));
		DtlsConnectorConfig dtls = DtlsConnectorConfig.builder(config)
				.setAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
				.setAdvancedPskStore(new AdvancedSinglePskStore(identity, key))
				.build();
		DTLSConnector connector = new DTLSConnector(dtls);
		CoapEndpoint endpoint = new CoapEndpoint.Builder().setConfiguration(config).setConnector(connector)
				.build();
		CoapClient client = new CoapClient(uri);
		client.setEndpoint(endpoint);
		client.setTimeout(15_000L);
		int ok = 0;
		for (int i = 1; i <= count; i++) {
			if (i > 1) {
				Thread.sleep(pauseMs);
			}
			CoapResponse response = client.get();
			if (response == null) {
				System.out.println("RESPONSE n=" + i + " code=none");
			} else {
				System.out.println("RESPONSE n=" + i + " code=" + response.getCode().text + " payload="
						+ response.getResponseText().replace("\n", "\\n"));
				if (response.isSuccess()) {
					ok++;
				}
			}
			System.out.flush();
		}
		System.out.println("DONE ok=" + ok);
		System.out.flush();
		client.shutdown();
		endpoint.destroy();
		System.exit(0);
	}
}
