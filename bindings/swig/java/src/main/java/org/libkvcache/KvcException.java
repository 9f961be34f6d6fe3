package org.libkvcache;

import java.nio.charset.StandardCharsets;

/**
 * A failed libkvcache call: the library's status code (one of the
 * {@code Kvc.ERR_*} constants) and its message, both captured inside the
 * failing native call.
 */
public class KvcException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final int status;
  private final String detail;

  /** A failure with {@code status} (a {@code Kvc.ERR_*} value) and the library's message. */
  public KvcException(int status, String message) {
    super(Kvc.statusName(status) + ": " + message);
    this.status = status;
    this.detail = message;
  }

  /* Thrown by the JNI wrappers (kvc_java_raise): the message as UTF-8 bytes. */
  KvcException(int status, byte[] message) {
    this(status, new String(message, StandardCharsets.UTF_8));
  }

  /** The status code, e.g. {@code Kvc.ERR_SEQ_NOT_FOUND}. */
  public int status() {
    return status;
  }

  /** The status code's name, e.g. {@code "KVC_ERR_SEQ_NOT_FOUND"}. */
  public String statusName() {
    return Kvc.statusName(status);
  }

  /** The library's message, without the status name. */
  public String detail() {
    return detail;
  }
}
