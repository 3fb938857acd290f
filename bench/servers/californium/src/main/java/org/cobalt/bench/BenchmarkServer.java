package org.cobalt.bench;

import java.net.InetSocketAddress;
import org.eclipse.californium.core.CoapResource;
import org.eclipse.californium.core.CoapServer;
import org.eclipse.californium.core.coap.CoAP.ResponseCode;
import org.eclipse.californium.core.coap.MediaTypeRegistry;
import org.eclipse.californium.core.network.CoapEndpoint;
import org.eclipse.californium.core.server.resources.CoapExchange;
import org.eclipse.californium.core.config.CoapConfig;
import org.eclipse.californium.elements.config.Configuration;
import org.eclipse.californium.elements.config.UdpConfig;

/** Serves GET /benchmark -> "hello world" on 127.0.0.1:PORT (first argument). */
public final class BenchmarkServer {
    private BenchmarkServer() {}

    public static void main(String[] args) {
        int port = args.length > 0 ? Integer.parseInt(args[0]) : 5683;
        CoapConfig.register();
        UdpConfig.register();
        Configuration config = Configuration.createStandardWithoutFile();
        CoapServer server = new CoapServer(config);
        CoapEndpoint endpoint = CoapEndpoint.builder()
                .setConfiguration(config)
                .setInetSocketAddress(new InetSocketAddress("127.0.0.1", port))
                .build();
        server.addEndpoint(endpoint);
        server.add(new CoapResource("benchmark") {
            @Override
            public void handleGET(CoapExchange exchange) {
                exchange.respond(ResponseCode.CONTENT, "hello world", MediaTypeRegistry.TEXT_PLAIN);
            }
        });
        server.start();
    }
}
