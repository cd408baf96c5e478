package io.walrelay.consumer;

import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;

/**
 * An OAuth 2 token endpoint on 127.0.0.1 for the tests of OAuth logins
 * (client credentials grant): it records each request and answers with an
 * unsigned token for {@code subject}, which a client accepts (it reads the
 * claims; brokers check the signature). Also in the test-jar, for the
 * example consumer's tests.
 */
public final class TokenEndpoint implements AutoCloseable {
    /** A token request: its Authorization header and its form body. */
    public record Request(String authorization, String body) {}

    private final List<Request> requests = new CopyOnWriteArrayList<>();
    private final HttpServer server;

    public TokenEndpoint(String subject) throws IOException {
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/token", exchange -> {
            String body = new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
            requests.add(new Request(exchange.getRequestHeaders().getFirst("Authorization"), body));
            byte[] reply = ("{\"access_token\":\"" + unsignedJwt(subject)
                    + "\",\"token_type\":\"bearer\",\"expires_in\":3600}").getBytes(StandardCharsets.UTF_8);
            exchange.getResponseHeaders().add("Content-Type", "application/json");
            exchange.sendResponseHeaders(200, reply.length);
            try (OutputStream out = exchange.getResponseBody()) {
                out.write(reply);
            }
        });
        server.start();
    }

    /** The endpoint's URL ({@code sasl.oauthbearer.token.endpoint.url}). */
    public String url() {
        return "http://127.0.0.1:" + server.getAddress().getPort() + "/token";
    }

    /** The requests so far, oldest first. */
    public List<Request> requests() {
        return List.copyOf(requests);
    }

    /** HTTP Basic credentials, as a client sends its id and secret. */
    public static String basic(String clientId, String secret) {
        return "Basic " + Base64.getEncoder().encodeToString((clientId + ":" + secret).getBytes(StandardCharsets.UTF_8));
    }

    /** A token whose claims a client accepts, with a signature no broker would. */
    public static String unsignedJwt(String subject) {
        long now = System.currentTimeMillis() / 1000;
        Base64.Encoder b64 = Base64.getUrlEncoder().withoutPadding();
        String header = b64.encodeToString("{\"alg\":\"none\",\"typ\":\"JWT\"}".getBytes(StandardCharsets.UTF_8));
        String claims = b64.encodeToString(("{\"sub\":\"" + subject + "\",\"iat\":" + now + ",\"exp\":" + (now + 3600)
                + ",\"scope\":\"kafka\"}").getBytes(StandardCharsets.UTF_8));
        return header + "." + claims + ".signature";
    }

    @Override
    public void close() {
        server.stop(0);
    }
}
