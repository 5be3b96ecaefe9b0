-- Keyspace sharded in two (-80, 80-) by a hash of customer_id.
CREATE TABLE customer (
  customer_id BIGINT NOT NULL,
  email VARCHAR(128),
  PRIMARY KEY (customer_id)
) ENGINE=InnoDB;

CREATE TABLE corder (
  order_id BIGINT NOT NULL,
  customer_id BIGINT NOT NULL,
  sku VARBINARY(128),
  price BIGINT,
  PRIMARY KEY (order_id)
) ENGINE=InnoDB;
